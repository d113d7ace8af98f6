"""GPU-hours paid for against GPU-hours used: per allocation, then per team, campaign and day.

Reads only. An allocation's *paid* GPU-hours are its GPUs times the elapsed part of its window
(a GPU reclaimed idle stops counting when it was reclaimed); its *used* GPU-hours are the
utilisation-weighted minutes its placed GPUs reported in that time (a GPU at 50 % for an hour
is half a GPU-hour used; a minute nobody reported counts as unused). Its *spend* is the net
charge: the settlement's charge plus any charge again on resume, minus every refund the
ledger made against it (cap, reclaim, failure; reference ``allocation:<id>``). *Idle spend*
is spend times the unused share of paid GPU-hours. Allocations without a placement (a tier
whose capacity an admin typed in, no GPUs reported) cannot be measured: their GPU-hours and
spend are counted as *unmeasured*, never as idle. Revoked allocations (voided rounds,
refunded whole) are left out.

Energy is the sum of the placed GPUs' per-minute energy (``SampleMinute.energy_j``, counter
resets already taken out) over the minutes they were the allocation's, in kWh.

The minute rows are joined to the allocations' (GPU, interval) pairs in the database, one
query per few thousand pairs, so nothing per minute comes back to Python.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from market.models import Allocation, Reclaim
from telemetry.models import Gpu, SampleMinute
from tenants.models import Campaign, Tenant, Transfer

__all__ = [
    "AllocationUse",
    "EfficiencyTotals",
    "allocations_use",
    "efficiency_by_campaign",
    "efficiency_by_day",
    "efficiency_totals",
    "efficiency_totals_sum",
    "team_use_trailing",
    "teams_by_idle_spend",
]

# Pairs (allocation, GPU, interval) per query on SQLite: four parameters each, well under its
# 32,766 bound parameters (and PostgreSQL's 65,535, for the transfers' references).
_CHUNK = 2000
_JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class AllocationUse:
    allocation: int
    tenant: int
    campaign: int | None
    day: date  # UTC day of the window's start
    paid_hours: float  # GPU-hours paid for so far
    used_hours: float  # utilisation-weighted GPU-hours reported
    spend: int  # net charge, milli-credits
    measured: bool  # placed on reported GPUs
    energy_j: float

    @property
    def idle_spend(self) -> int:
        if not self.measured or self.paid_hours <= 0:
            return 0
        unused = max(self.paid_hours - self.used_hours, 0.0) / self.paid_hours
        return round(self.spend * unused)


@dataclass
class EfficiencyTotals:
    """Sums over allocations. Money in milli-credits, time in GPU-hours, energy in kWh."""

    paid_hours: float = 0.0
    used_hours: float = 0.0
    unmeasured_hours: float = 0.0
    spend: int = 0
    idle_spend: int = 0
    unmeasured_spend: int = 0
    energy_kwh: float = 0.0
    allocations: int = 0
    measured_paid_hours: float = field(default=0.0, repr=False)

    def add(self, use: AllocationUse) -> None:
        self.allocations += 1
        self.paid_hours += use.paid_hours
        self.spend += use.spend
        if use.measured:
            self.measured_paid_hours += use.paid_hours
            self.used_hours += use.used_hours
            self.idle_spend += use.idle_spend
            self.energy_kwh += use.energy_j / _JOULES_PER_KWH
        else:
            self.unmeasured_hours += use.paid_hours
            self.unmeasured_spend += use.spend

    @property
    def measured_spend(self) -> int:
        return self.spend - self.unmeasured_spend

    @property
    def used_pct(self) -> float | None:
        """Used share of the measured paid GPU-hours, percent."""
        if self.measured_paid_hours <= 0:
            return None
        return 100.0 * self.used_hours / self.measured_paid_hours

    @property
    def cost_per_used_hour(self) -> int | None:
        """Measured spend per GPU-hour actually used, milli-credits (None if nothing used)."""
        if self.used_hours <= 0:
            return None
        return round(self.measured_spend / self.used_hours)


def _allocations(*, since: datetime, until: datetime, tenant: Tenant | None, now: datetime):
    qs = Allocation.objects.exclude(status=Allocation.Status.REVOKED).filter(
        starts_at__lt=min(until, now), ends_at__gt=since
    )
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    return qs.values_list(
        "pk", "tenant_id", "bid__campaign_id", "gpus", "starts_at", "ends_at", "charge", "placement"
    )


def _net_spend(charges: dict[int, int]) -> dict[int, int]:
    """Each allocation's charge, plus charges again and minus refunds made against it."""
    spend = dict(charges)
    refs = {f"allocation:{pk}": pk for pk in charges}
    for start in range(0, len(refs), _CHUNK):
        chunk = list(refs)[start : start + _CHUNK]
        rows = (
            Transfer.objects.filter(
                reference__in=chunk, kind__in=[Transfer.Kind.CHARGE, Transfer.Kind.REFUND]
            )
            .values_list("reference", "kind")
            .annotate(total=Sum("amount"))
        )
        for reference, kind, total in rows:
            sign = 1 if kind == Transfer.Kind.CHARGE else -1
            spend[refs[reference]] += sign * int(total)
    return {pk: max(amount, 0) for pk, amount in spend.items()}


def _minute_sums(
    pairs: Sequence[tuple[int, int, datetime, datetime]],
) -> dict[tuple[int, int], tuple[float, float]]:
    """{(allocation, gpu): (sum of per-minute utilisation %, energy J)} over each pair's
    [start, end), summed in the database.

    A lateral subquery per pair, not a join: each pair is one range scan of the unique (gpu,
    minute) index, where a join let the planner hash every minute row of the GPUs against
    every pair of the same GPU (bench/metrics_scrape.py).
    On PostgreSQL the pairs travel as four arrays (a VALUES list of thousands of
    placeholders cost more to send than to run); SQLite gets VALUES in chunks."""
    if not pairs:
        return {}
    table = SampleMinute._meta.db_table
    window = "m.gpu_id = iv.gpu AND m.minute >= iv.s AND m.minute < iv.e"
    select = (
        f"SELECT iv.allocation, iv.gpu, "
        f"(SELECT SUM(m.utilization_avg) FROM {table} m WHERE {window}), "
        f"(SELECT SUM(m.energy_j) FROM {table} m WHERE {window}) "
    )
    queries: list[tuple[str, list[object]]] = []
    if connection.vendor == "postgresql":
        columns = [list(column) for column in zip(*pairs, strict=True)]
        queries.append(
            (
                "SELECT iv.allocation, iv.gpu, w.util, w.energy FROM unnest(%s::bigint[], "
                "%s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS iv(allocation, gpu, s, e) "
                "CROSS JOIN LATERAL (SELECT SUM(m.utilization_avg) AS util, SUM(m.energy_j) AS "
                f"energy FROM {table} m WHERE {window}) w",
                columns,
            )
        )
    else:
        adapt = connection.ops.adapt_datetimefield_value
        for start in range(0, len(pairs), _CHUNK):
            chunk = pairs[start : start + _CHUNK]
            values = ", ".join(["(%s, %s, %s, %s)"] * len(chunk))
            params: list[object] = []
            for allocation, gpu, begin, end in chunk:
                params += [allocation, gpu, adapt(begin), adapt(end)]
            queries.append(
                (
                    f"WITH iv(allocation, gpu, s, e) AS (VALUES {values}) " + select + "FROM iv",
                    params,
                )
            )
    out: dict[tuple[int, int], tuple[float, float]] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The planner's cost for thousands of index scans switches JIT compilation on,
            # which took longer (0.3 s) than the scans themselves.
            cursor.execute("SET LOCAL jit = off")
        for sql, params in queries:
            cursor.execute(sql, params)
            for allocation, gpu, util, energy in cursor.fetchall():
                out[(allocation, gpu)] = (float(util or 0.0), max(float(energy or 0.0), 0.0))
    return out


def allocations_use(
    *,
    since: datetime,
    until: datetime,
    tenant: Tenant | None = None,
    now: datetime | None = None,
    clip: bool = False,
    with_spend: bool = True,
) -> list[AllocationUse]:
    """Every allocation whose window overlaps [since, until) and has started (one tenant's,
    or everyone's when ``tenant`` is None), measured up to ``now``. The whole window of each
    is counted (a period holds whole allocations), or with ``clip`` only its GPU-hours inside
    [since, until) (spend stays whole). Without ``with_spend`` every spend is 0 (the ledger
    is not read)."""
    now = now or timezone.now()
    rows = list(_allocations(since=since, until=until, tenant=tenant, now=now))
    if not rows:
        return []
    charges = {pk: charge for pk, _, _, _, _, _, charge, _ in rows}
    spend = _net_spend(charges) if with_spend else dict.fromkeys(charges, 0)
    uuids = {p["uuid"] for *_, placement in rows for p in placement or [] if p.get("uuid")}
    gpu_ids = dict(Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "pk")) if uuids else {}
    reclaimed = {
        (a, u): at
        for a, u, at in Reclaim.objects.filter(
            allocation_id__in=[r[0] for r in rows], status=Reclaim.Status.RECLAIMED
        ).values_list("allocation_id", "gpu_uuid", "reclaimed_at")
    }
    pairs: list[tuple[int, int, datetime, datetime]] = []
    paid: dict[int, float] = {}
    measured: dict[int, bool] = {}
    for pk, _, _, gpus, window_start, ends, _, placement in rows:
        starts = max(window_start, since) if clip else window_start
        end = min(ends, now, until) if clip else min(ends, now)
        placed = [p for p in placement or [] if gpu_ids.get(p.get("uuid"))]
        measured[pk] = bool(placed)
        if not placed:
            paid[pk] = gpus * max((end - starts).total_seconds(), 0.0) / 3600
            continue
        hours = 0.0
        for p in placed:
            gpu_end = min(end, reclaimed.get((pk, p["uuid"])) or end)
            hours += max((gpu_end - starts).total_seconds(), 0.0) / 3600
            if gpu_end > starts:
                pairs.append((pk, gpu_ids[p["uuid"]], starts, gpu_end))
        paid[pk] = hours
    sums = _minute_sums(pairs)
    used: dict[int, float] = defaultdict(float)
    energy: dict[int, float] = defaultdict(float)
    for (pk, _), (util, joules) in sums.items():
        used[pk] += util / 100 / 60  # each minute row is 1/60 h at its average utilisation
        energy[pk] += joules
    return [
        AllocationUse(
            allocation=pk,
            tenant=tenant_id,
            campaign=campaign_id,
            day=starts.astimezone(UTC).date(),
            paid_hours=paid[pk],
            used_hours=min(used[pk], paid[pk]),
            spend=spend[pk],
            measured=measured[pk],
            energy_j=energy[pk],
        )
        for pk, tenant_id, campaign_id, _, starts, _, _, _ in rows
    ]


def efficiency_totals(uses: Iterable[AllocationUse]) -> EfficiencyTotals:
    totals = EfficiencyTotals()
    for use in uses:
        totals.add(use)
    return totals


def efficiency_totals_sum(parts: Iterable[EfficiencyTotals]) -> EfficiencyTotals:
    """Totals of totals (a period's days, the teams of a ranking)."""
    total = EfficiencyTotals()
    for part in parts:
        for f in fields(EfficiencyTotals):
            setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
    return total


def _period(days: int, now: datetime | None) -> tuple[datetime, datetime, datetime]:
    now = now or timezone.now()
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days - 1), today + timedelta(days=1), now


def efficiency_by_day(
    *, tenant: Tenant, days: int, campaign: Campaign | None = None, now: datetime | None = None
) -> list[tuple[date, EfficiencyTotals]]:
    """The tenant's last ``days`` UTC days (today included), oldest first, every day present;
    only ``campaign``'s allocations if given (it must be the tenant's: the caller fetched it
    through the tenant)."""
    since, until, now = _period(days, now)
    by_day: dict[date, EfficiencyTotals] = {
        (since + timedelta(days=i)).date(): EfficiencyTotals() for i in range(days)
    }
    for use in allocations_use(since=since, until=until, tenant=tenant, now=now):
        if campaign is not None and use.campaign != campaign.pk:
            continue
        if use.day in by_day:
            by_day[use.day].add(use)
    return sorted(by_day.items())


def efficiency_by_campaign(
    *, tenant: Tenant, days: int, now: datetime | None = None
) -> list[tuple[Campaign | None, EfficiencyTotals]]:
    """The tenant's allocations of the last ``days`` days by campaign (None: no campaign),
    most idle spend first."""
    since, until, now = _period(days, now)
    groups: dict[int | None, EfficiencyTotals] = defaultdict(EfficiencyTotals)
    for use in allocations_use(since=since, until=until, tenant=tenant, now=now):
        if use.day >= since.date():
            groups[use.campaign].add(use)
    campaigns = Campaign.objects.filter(tenant=tenant, pk__in=[k for k in groups if k]).in_bulk()
    rows = [(campaigns.get(k) if k else None, totals) for k, totals in groups.items()]
    return sorted(rows, key=lambda row: (-row[1].idle_spend, str(row[0] or "")))


def teams_by_idle_spend(
    *, days: int, now: datetime | None = None
) -> list[tuple[Tenant, EfficiencyTotals]]:
    """Every team with allocations in the last ``days`` days, most idle spend first (staff)."""
    since, until, now = _period(days, now)
    groups: dict[int, EfficiencyTotals] = defaultdict(EfficiencyTotals)
    for use in allocations_use(since=since, until=until, now=now):
        if use.day >= since.date():
            groups[use.tenant].add(use)
    tenants = Tenant.objects.filter(pk__in=list(groups)).in_bulk()
    rows = [(tenants[pk], totals) for pk, totals in groups.items()]
    return sorted(rows, key=lambda row: (-row[1].idle_spend, row[0].name))


def team_use_trailing(*, hours: int, now: datetime | None = None) -> dict[int, EfficiencyTotals]:
    """{tenant id: totals} of the GPU-hours of the last ``hours`` hours (allocations clipped
    to them; for /metrics: bounded work per scrape). Spend is not read: 0."""
    now = now or timezone.now()
    since = now - timedelta(hours=hours)
    groups: dict[int, EfficiencyTotals] = defaultdict(EfficiencyTotals)
    for use in allocations_use(since=since, until=now, now=now, clip=True, with_spend=False):
        groups[use.tenant].add(use)
    return dict(groups)
