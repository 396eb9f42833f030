"""django.contrib.admin with the portal's admin site; apart from hcsportal.apps, whose config Django finds by itself."""

from django.contrib.admin.apps import AdminConfig


class PortalAdminConfig(AdminConfig):
    """The admin app, whose site has the operator dashboard as its index (hcsportal.admin_site)."""

    default = False
    default_site = "hcsportal.admin_site.PortalAdminSite"
