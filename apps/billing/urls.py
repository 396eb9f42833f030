"""Billing pages: project costs and invoices."""

app_name = "billing"
urlpatterns: list = []
