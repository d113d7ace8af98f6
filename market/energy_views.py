"""The energy a team used: the spend page's energy section and its CSV export."""

from __future__ import annotations

import csv
from datetime import UTC, date, datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from market.energy import kwh, tenant_energy, tenant_energy_by_tier
from tenants.access import require_tenant
from tenants.models import Tenant

RECENT = 50
CSV_COLUMNS = (
    "allocation",
    "round",
    "tier",
    "starts_at",
    "ends_at",
    "gpus",
    "energy_kwh",
    "energy_charge_credits",
)


def energy_context(*, tenant: Tenant, since: date) -> dict[str, Any]:
    """The spend page's energy section: this month's kWh and charge per tier, and the newest
    metered allocations."""
    start = datetime.combine(since, datetime.min.time(), tzinfo=UTC)
    by_tier = tenant_energy_by_tier(tenant=tenant, since=start)
    return {
        "energy_by_tier": by_tier,
        "energy_month_kwh": sum((t.kwh for t in by_tier), start=kwh(0)),
        "energy_month_charge": sum(t.charge for t in by_tier),
        "energy_rows": [
            {"allocation": a, "kwh": kwh(a.energy_j)} for a in tenant_energy(tenant=tenant)[:RECENT]
        ],
    }


@require_GET
@login_required
def energy_csv(request: HttpRequest) -> HttpResponse:
    """Every metered allocation of the caller's team: kWh and energy charge, one row each."""
    tenant = require_tenant(request.user)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="energy-{tenant.slug}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for a in tenant_energy(tenant=tenant).iterator(chunk_size=2000):
        writer.writerow(
            [
                a.pk,
                a.round_id,
                a.tier.slug,
                a.starts_at.isoformat(),
                a.ends_at.isoformat(),
                a.gpus,
                kwh(a.energy_j),
                _plain_credits(a.energy_charge),
            ]
        )
    return response


def _plain_credits(amount: int) -> str:
    """Milli-credits as a plain decimal for spreadsheets: 12345 -> '12.345'."""
    return f"{amount // 1000}.{amount % 1000:03d}"
