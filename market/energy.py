"""Reads of the energy a team's allocations used (metered after each window by telemetry,
docs/capacity.md "Energy"): per allocation, and summed per tier and round; kWh as exact
decimals from whole joules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet, Sum

from market.models import Allocation
from tenants.access import scoped
from tenants.models import Tenant

JOULES_PER_KWH = 3_600_000


def kwh(joules: int) -> Decimal:
    """Whole joules as kWh, to the watt-hour's thousandth (3.6 J) and no further."""
    return (Decimal(joules) / JOULES_PER_KWH).quantize(Decimal("0.000001"))


def tenant_energy(*, tenant: Tenant, since: datetime | None = None) -> QuerySet[Allocation]:
    """The tenant's metered allocations, newest window first (``since``: windows ending at or
    after it)."""
    rows = scoped(Allocation.objects, tenant=tenant).filter(energy_j__isnull=False)
    if since is not None:
        rows = rows.filter(ends_at__gte=since)
    return rows.select_related("tier").order_by("-ends_at", "-pk")


@dataclass(frozen=True)
class EnergyTotal:
    tier: str
    kwh: Decimal
    charge: int  # milli-credits


def tenant_energy_by_tier(*, tenant: Tenant, since: datetime | None = None) -> list[EnergyTotal]:
    rows = (
        tenant_energy(tenant=tenant, since=since)
        .order_by()
        .values("tier__slug")
        .annotate(joules=Sum("energy_j"), charge=Sum("energy_charge"))
        .order_by("tier__slug")
    )
    return [EnergyTotal(r["tier__slug"], kwh(r["joules"] or 0), r["charge"] or 0) for r in rows]
