"""Billing pages: project costs and invoices."""

from django.urls import path

from apps.billing import views

app_name = "billing"
urlpatterns = [
    path("", views.billing_index, name="index"),
    path("projects/<int:project_id>/", views.project_billing, name="project"),
    path("invoices/<int:invoice_id>/", views.invoice_detail, name="invoice"),
    path("invoices/<int:invoice_id>/csv/", views.invoice_csv, name="invoice-csv"),
]
