"""The per-project remote-GPU key: derived from the portal's secret key, never stored, given to every task of
the project as the secret variable ``HCS_REMOTE_GPU_KEY``."""

from __future__ import annotations

from django.utils.crypto import salted_hmac

from apps.vdc.models import Project

KEY_VARIABLE = "HCS_REMOTE_GPU_KEY"
_SALT = "hcs.remotegpu.project-key"


def project_key(project: Project) -> str:
    """The project's key (64 hex digits). The project's id, name and creation time all enter it, so a new
    project that reuses a deleted one's name or id gets another key."""
    identity = f"{project.pk}:{project.name}:{project.created_at.isoformat()}"
    return salted_hmac(_SALT, identity, algorithm="sha256").hexdigest()


def remote_gpu_secrets(project: Project) -> dict[str, str]:
    """The secret variables a task of ``project`` gets for remote GPU (both ends use the same key)."""
    return {KEY_VARIABLE: project_key(project)}
