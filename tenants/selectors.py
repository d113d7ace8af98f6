"""Reads for the tenant pages. Tenant-owned rows are always scoped to a tenant passed in; the
staff reads (every tenant, every grant) say so in their names."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from tenants.access import scoped
from tenants.budgets import BudgetUsage, budget_usage, tenant_hard_capped
from tenants.models import Account, Budget, Campaign, Membership, Notification, Tenant, Transfer
from tenants.overview import hard_cap_blocks


def notifications_unread(*, tenant: Tenant, limit: int = 10) -> QuerySet[Notification]:
    """The tenant's newest unread notifications (a notice that no longer holds is cleared)."""
    return scoped(Notification.objects, tenant=tenant).filter(read_at__isnull=True)[:limit]


def notifications_platform(*, limit: int = 20) -> QuerySet[Notification]:
    """The newest notifications addressed to no tenant (the staff overview)."""
    return Notification.objects.filter(tenant__isnull=True)[:limit]


def budgets_active(*, tenant: Tenant) -> QuerySet[Budget]:
    """The tenant's budgets in force, with their campaigns."""
    return scoped(Budget.objects.filter(active=True), tenant=tenant).select_related("campaign")


def budgets_active_all() -> QuerySet[Budget]:
    """Every tenant's budgets in force (the staff budgets page)."""
    return Budget.objects.filter(active=True).select_related("tenant", "campaign")


def budget_in_force(*, tenant: Tenant, window: str, campaign: Campaign | None) -> Budget | None:
    """The tenant's active budget for ``window`` and ``campaign`` (None: the whole team)."""
    return Budget.objects.filter(
        tenant=tenant, window=window, campaign=campaign, active=True
    ).first()


def teams_capped() -> list[tuple[Tenant, Budget]]:
    """Teams at a hard spend cap now, with the budget that caps them, by name."""
    ids = Budget.objects.filter(active=True, mode=Budget.Mode.HARD).values_list(
        "tenant_id", flat=True
    )
    rows = []
    for tenant in Tenant.objects.filter(pk__in=ids).order_by("name"):
        budget = tenant_hard_capped(tenant=tenant)
        if budget is not None:
            rows.append((tenant, budget))
    return rows


def teams_blocked() -> list[tuple[Any, list[BudgetUsage]]]:
    """Teams a hard cap left bids of out of the latest cleared round, each with the usage of
    its hard budgets now: a cap that blocks every bid while nothing is spent is as much a stop
    as one that is reached."""
    now = timezone.now()
    return [
        (
            block,
            [
                budget_usage(budget=b, at=now)
                for b in Budget.objects.filter(
                    tenant=block.tenant, active=True, mode=Budget.Mode.HARD
                ).select_related("campaign")
            ],
        )
        for block in hard_cap_blocks()
    ]


def members_of(*, tenant: Tenant) -> QuerySet[Membership]:
    """The tenant's members with their accounts, by username."""
    return (
        scoped(Membership.objects, tenant=tenant).select_related("user").order_by("user__username")
    )


def member_get(*, tenant: Tenant, username: str) -> Membership | None:
    """The tenant's member signed in as ``username``, or None."""
    return scoped(Membership.objects, tenant=tenant).filter(user__username=username).first()


def campaigns_of(*, tenant: Tenant) -> QuerySet[Campaign]:
    """The tenant's campaigns (the choices of its budget form)."""
    return scoped(Campaign.objects, tenant=tenant)


def campaigns_with_budgets(*, tenant: Tenant) -> QuerySet[Campaign]:
    """The tenant's campaigns, each with its active budgets prefetched as ``budgets``."""
    return campaigns_of(tenant=tenant).prefetch_related(
        Prefetch("budgets", queryset=Budget.objects.filter(active=True))
    )


def campaigns_all() -> QuerySet[Campaign]:
    """Every tenant's campaigns (the staff budget form's choices)."""
    return Campaign.objects.select_related("tenant")


def tenants_all() -> QuerySet[Tenant]:
    """Every tenant with its accounts (by kind) and members (the staff tenants page)."""
    return Tenant.objects.prefetch_related(
        Prefetch("accounts", queryset=Account.objects.order_by("kind")), "memberships__user"
    )


def grants_recent(*, limit: int = 50) -> QuerySet[Transfer]:
    """The newest credit grants to any tenant, with who was granted and by whom."""
    return Transfer.objects.filter(kind=Transfer.Kind.GRANT).select_related("tenant", "actor")[
        :limit
    ]


def tenant_names(*, ids: list[int]) -> dict[int, str]:
    """{tenant id: name} for the tenants among ``ids`` (the ids a round's record names)."""
    return dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "name"))


def ledger_transfers(
    *,
    tenant: Tenant,
    kind: str | None = None,
    reference: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Transfer]:
    """The tenant's transfers, newest first, narrowed by whichever filters are given
    (``since`` inclusive, ``until`` exclusive)."""
    qs = scoped(Transfer.objects.select_related("source", "destination"), tenant=tenant).order_by(
        "-created_at", "-id"
    )
    if kind is not None:
        qs = qs.filter(kind=kind)
    if reference is not None:
        qs = qs.filter(reference=reference)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    return qs


def budgets_of(*, tenant: Tenant) -> QuerySet[Budget]:
    """Every budget of the tenant (active or not) with its campaign, by window."""
    return scoped(Budget.objects.select_related("campaign"), tenant=tenant).order_by("window", "id")


def notifications_of(*, tenant: Tenant, unread: bool = False) -> QuerySet[Notification]:
    """The tenant's notifications, or only the unread ones."""
    qs = scoped(Notification.objects, tenant=tenant)
    return qs.filter(read_at__isnull=True) if unread else qs
