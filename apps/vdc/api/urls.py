"""Routes of the vdc app's API; hcsportal/api_urls.py registers them on the v1 router."""

from apps.vdc.api import views

ROUTES = [
    ("vdcs", views.VDCViewSet, "vdc"),
    ("projects", views.ProjectViewSet, "project"),
    ("memberships", views.MembershipViewSet, "membership"),
    ("vdc-quotas", views.ProjectQuotaViewSet, "projectquota"),
    ("project-secrets", views.ProjectSecretViewSet, "projectsecret"),
    ("capacity-loans", views.CapacityLoanViewSet, "capacityloan"),
    ("rebalancer-settings", views.RebalancerSettingsViewSet, "rebalancersettings"),
]

urlpatterns: list = []
