"""Routes of the billing app's read-only API; hcsportal/api_urls.py registers them on the v1 router."""

from apps.billing.api import views

ROUTES = [
    ("billing/prices", views.PriceRuleViewSet, "pricerule"),
    ("billing/accounts", views.AccountViewSet, "account"),
    ("billing/usage", views.UsageRecordViewSet, "usagerecord"),
    ("billing/transactions", views.TransactionViewSet, "transaction"),
    ("billing/invoices", views.InvoiceViewSet, "invoice"),
]

urlpatterns: list = []
