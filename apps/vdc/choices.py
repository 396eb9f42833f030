"""Enumerations of the vdc app."""

from django.db import models


class QueuePolicy(models.TextChoices):
    FIFO = "fifo", "FIFO (submit order)"
    DRF = "drf", "DRF (dominant resource fairness)"
    BACKFILL = "backfill", "Backfill (EASY, with reservations)"
    NONSTRICT_FIFO = "nonstrict_fifo", "Non-strict FIFO (blocked head keeps its nodes, later tasks that fit run)"
    LAS = "las", "Least attained service (2D-LAS, favours short jobs)"
    SJF = "sjf", "Shortest expected job first"
    FAIR_SHARE = "fair_share", "Weighted fair share (DRF / project weight)"


class ClusterSelectionStrategy(models.TextChoices):
    LOAD_BALANCING = "load_balancing", "Load balancing"
    RESOURCE_FIT = "resource_fit", "Resource fit"
    PRIORITY_WEIGHT = "priority_weight", "Priority / weight"
    AFFINITY = "affinity", "Affinity (labels, preferred clusters)"
    COST_OPTIMIZED = "cost_optimized", "Cost optimised"


class NodeScorer(models.TextChoices):
    FGD = "fgd", "Fragmentation gradient descent"
    BEST_FIT = "best_fit", "Best fit"
    FIRST_FIT = "first_fit", "First fit"


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


class LoanBilling(models.TextChoices):
    """Who pays for capacity a project runs on a loan (``RebalancerSettings.loan_billing``)."""

    BORROWER_PAYS = "borrower_pays", "Borrower pays (metered like any usage)"
    LENDER_CREDITED = "lender_credited", "Borrower pays, lender is credited the same value"
    NEITHER = "neither", "Neither: the borrower is refunded the loaned usage"


class LoanReturnReason(models.TextChoices):
    """Why a capacity loan ended (the rebalancer's rules, or an admin)."""

    EXPIRED = "expired", "Expired"
    LENDER_DEMAND = "lender_demand", "The lender needs it"
    BORROWER_IDLE = "borrower_idle", "The borrower no longer uses it"
    ADMIN = "admin", "Returned by an admin"
