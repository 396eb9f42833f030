"""Date formats of the portal in English (``FORMAT_MODULE_PATH``): what the admin and a datetime printed bare in a
template show, the same as the ``moment`` filter ("2026-11-29 07:30 UTC")."""

from apps.core.templatetags.moments import MINUTES

DATETIME_FORMAT = MINUTES
SHORT_DATETIME_FORMAT = MINUTES
