"""Routes of the billing app's read-only API; hcsportal/api_urls.py registers them on the v1 router."""

from django.urls import path

from apps.billing.api import views
from apps.billing.api.price_preview import PricePreviewView

ROUTES = [
    ("billing/prices", views.PriceRuleViewSet, "pricerule"),
    ("billing/accounts", views.AccountViewSet, "account"),
    ("billing/usage", views.UsageRecordViewSet, "usagerecord"),
    ("billing/transactions", views.TransactionViewSet, "transaction"),
    ("billing/invoices", views.InvoiceViewSet, "invoice"),
    ("alerts", views.ProjectAlertViewSet, "projectalert"),
]

urlpatterns = [path("billing/price-preview/", PricePreviewView.as_view(), name="billing-price-preview")]
