"""The operators' series of ``/metrics``: per GPU, per team and of the market (issue 39).

Appended to the platform-wide families of ``telemetry/metrics.py`` in the same exposition
format. Cardinality is bounded by what the platform has, never by traffic: one series set per
registered GPU (revoked nodes left out), per team, per active tier; no series per allocation,
bid, campaign or process. Teams are labelled by slug, never by display name.

Per-scrape work stays bounded: the GPU readings are each GPU's newest raw sample (one indexed
lookup per GPU, samples older than ``GPUMARKET_NODE_STALE_SECONDS`` dropped so a silent GPU's
readings go stale in Prometheus rather than freeze), team money comes from account balances
and the last 24 hours' transfers, and GPU-seconds (Prometheus' base unit) from the last 24 hours' allocations and minute
rollups.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation, Bid, PolicyVersion, Round, Tier
from telemetry.efficiency.selectors import team_use_trailing
from telemetry.metrics import _Family
from telemetry.models import Gpu, ProcessObservation, Sample
from tenants.models import Account, Tenant, Transfer

MIB = 1024 * 1024
TRAILING_HOURS = 24
# Audit actions of the guardrails (market/services/guardrails.py) and what each means.
GUARDRAIL_ACTIONS = {"policy.rollback": "rolled_back", "policy.guardrail_breach": "not_rolled_back"}


def gpu_families() -> list[_Family]:
    """Health and the newest fresh reading of every GPU on an unrevoked node."""
    labels = ("node", "gpu", "uuid", "tier")
    healthy = _Family(
        "gpumarket_gpu_healthy",
        "gauge",
        "1 when the GPU is reported healthy on a healthy node and not in maintenance.",
    )
    maintenance = _Family(
        "gpumarket_gpu_maintenance",
        "gauge",
        "1 when the GPU is out of its tier's capacity (by an admin, or a reported failure).",
    )
    failed = _Family(
        "gpumarket_gpu_failed",
        "gauge",
        "1 when telemetry took the GPU out for a fatal error (XID, uncorrectable ECC, off the bus).",
    )
    ecc = _Family(
        "gpumarket_gpu_ecc_uncorrected_volatile",
        "gauge",
        "Uncorrectable ECC errors since the driver loaded, as last reported.",
    )
    util = _Family(
        "gpumarket_gpu_utilization_percent", "gauge", "GPU utilisation in its newest sample."
    )
    mem_used = _Family(
        "gpumarket_gpu_memory_used_bytes", "gauge", "GPU memory in use in its newest sample."
    )
    mem_total = _Family("gpumarket_gpu_memory_total_bytes", "gauge", "GPU memory size.")
    power = _Family("gpumarket_gpu_power_watts", "gauge", "Power draw in the GPU's newest sample.")
    temp = _Family(
        "gpumarket_gpu_temperature_celsius", "gauge", "Temperature in the GPU's newest sample."
    )
    since = timezone.now() - timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS)
    newest = Sample.objects.filter(gpu=OuterRef("pk"), at__gte=since).order_by("-at")
    gpus = list(
        Gpu.objects.filter(node__revoked_at__isnull=True)
        .annotate(sample_id=Subquery(newest.values("pk")[:1]))
        .values(
            "node__name",
            "index",
            "uuid",
            "tier__slug",
            "healthy",
            "node__healthy",
            "maintenance",
            "failure",
            "ecc_volatile_uncorrected",
            "memory_total_mib",
            "sample_id",
        )
        .order_by("node__name", "index")
    )
    readings = Sample.objects.in_bulk([g["sample_id"] for g in gpus if g["sample_id"]])
    for g in gpus:
        key = dict(
            zip(labels, (g["node__name"], g["index"], g["uuid"], g["tier__slug"]), strict=True)
        )
        up = g["healthy"] and g["node__healthy"] and not g["maintenance"]
        healthy.add(int(up), **key)
        maintenance.add(int(g["maintenance"]), **key)
        failed.add(int(bool(g["failure"])), **key)
        ecc.add(g["ecc_volatile_uncorrected"], **key)
        mem_total.add(g["memory_total_mib"] * MIB, **key)
        sample = readings.get(g["sample_id"])
        if sample is not None:
            util.add(sample.utilization_pct, **key)
            mem_used.add(sample.memory_used_mib * MIB, **key)
            power.add(sample.power_w, **key)
            temp.add(sample.temperature_c, **key)
    return [healthy, maintenance, failed, ecc, util, mem_used, mem_total, power, temp]


def team_families() -> list[_Family]:
    """Money, GPUs and paused work of every team, labelled by slug."""
    now = timezone.now()
    since = now - timedelta(hours=TRAILING_HOURS)
    available = _Family(
        "gpumarket_team_available_millicredits", "gauge", "Credits a team can bid with."
    )
    escrow = _Family(
        "gpumarket_team_escrow_millicredits", "gauge", "Credits a team holds in escrow for bids."
    )
    spend = _Family(
        "gpumarket_team_spend_24h_millicredits",
        "gauge",
        "Charges minus refunds of the last 24 hours.",
    )
    allocated_now = _Family(
        "gpumarket_team_gpus_allocated",
        "gauge",
        "GPUs in the team's allocations whose window holds now (active or paused).",
    )
    allocated = _Family(
        "gpumarket_team_gpu_seconds_allocated_24h",
        "gauge",
        "GPU-seconds of the team's allocations within the last 24 hours.",
    )
    used = _Family(
        "gpumarket_team_gpu_seconds_used_24h",
        "gauge",
        "Utilisation-weighted GPU-seconds the team's placed GPUs reported in the last 24 hours.",
    )
    unmeasured = _Family(
        "gpumarket_team_gpu_seconds_unmeasured_24h",
        "gauge",
        "GPU-seconds of the last 24 hours on allocations without a placement (use not measured).",
    )
    paused = _Family(
        "gpumarket_team_allocations_paused",
        "gauge",
        "The team's allocations paused by a hard spend cap, window holding now.",
    )
    stopped = _Family(
        "gpumarket_team_processes_stopped",
        "gauge",
        "Processes tagged with the team's allocations seen stopped in their GPU's newest sample.",
    )
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    balances, spend_24h = _team_money(since=since)
    live, paused_now, stopped_now = _team_work_now(now=now)
    use = team_use_trailing(hours=TRAILING_HOURS, now=now)
    for pk, slug in sorted(slugs.items(), key=lambda item: item[1]):
        available.add(balances.get((pk, Account.Kind.AVAILABLE), 0), team=slug)
        escrow.add(balances.get((pk, Account.Kind.ESCROW), 0), team=slug)
        spend.add(spend_24h.get(pk, 0), team=slug)
        allocated_now.add(live.get(pk, 0), team=slug)
        totals = use.get(pk)
        allocated.add(round(totals.paid_hours * 3600, 1) if totals else 0, team=slug)
        used.add(round(totals.used_hours * 3600, 1) if totals else 0, team=slug)
        unmeasured.add(round(totals.unmeasured_hours * 3600, 1) if totals else 0, team=slug)
        paused.add(paused_now.get(pk, 0), team=slug)
        stopped.add(stopped_now.get(pk, 0), team=slug)
    return [available, escrow, spend, allocated_now, allocated, used, unmeasured, paused, stopped]


def _team_money(*, since: datetime) -> tuple[dict[tuple[int, str], int], dict[int, int]]:
    """{(team id, account kind): balance} and {team id: charges minus refunds since}."""
    balances = {
        (tenant, kind): balance
        for tenant, kind, balance in Account.objects.filter(tenant__isnull=False).values_list(
            "tenant_id", "kind", "balance"
        )
    }
    flows = (
        Transfer.objects.filter(
            created_at__gte=since, kind__in=[Transfer.Kind.CHARGE, Transfer.Kind.REFUND]
        )
        .values_list("tenant_id", "kind")
        .annotate(total=Sum("amount"))
    )
    spend: dict[int, int] = {}
    for tenant, kind, total in flows:
        sign = 1 if kind == Transfer.Kind.CHARGE else -1
        spend[tenant] = spend.get(tenant, 0) + sign * int(total)
    return balances, spend


def _team_work_now(*, now: datetime) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """By team id: GPUs allocated in the window holding now, allocations paused in it, and
    its processes seen stopped."""
    window_now = Q(starts_at__lte=now, ends_at__gt=now)
    live = dict(
        Allocation.objects.filter(
            window_now, status__in=[Allocation.Status.ACTIVE, Allocation.Status.PAUSED]
        )
        .values_list("tenant_id")
        .annotate(n=Sum("gpus"))
    )
    paused = dict(
        Allocation.objects.filter(window_now, status=Allocation.Status.PAUSED)
        .values_list("tenant_id")
        .annotate(n=Count("id"))
    )
    owner = Allocation.objects.filter(pk=OuterRef("allocation_ref")).values("tenant_id")[:1]
    stopped = dict(
        ProcessObservation.objects.filter(state=ProcessObservation.State.STOPPED)
        .annotate(owner=Subquery(owner))
        .filter(owner__isnull=False)
        .values_list("owner")
        .annotate(n=Count("id"))
    )
    return live, paused, stopped


def market_families() -> list[_Family]:
    """The last settled round's timings and unmet demand, reserves, overdue rounds and
    guardrail trips."""
    now = timezone.now()
    clear = _Family(
        "gpumarket_round_clear_seconds",
        "gauge",
        "Clearing time (arrays, solve, rounding) of the last settled round.",
    )
    settle = _Family(
        "gpumarket_round_settle_seconds",
        "gauge",
        "Seconds from the last settled round's clearing to its settlement.",
    )
    settled_at = _Family(
        "gpumarket_round_last_settled_timestamp_seconds",
        "gauge",
        "Unix time the last round was settled.",
    )
    unmet = _Family(
        "gpumarket_round_unmet_demand_gpus",
        "gauge",
        "GPUs the last settled round's bids asked for and did not win.",
    )
    overdue = _Family(
        "gpumarket_round_overdue_seconds",
        "gauge",
        "How long the oldest round whose bidding closed has waited to be cleared (0: none).",
    )
    reserve = _Family(
        "gpumarket_tier_reserve_millicredits",
        "gauge",
        "Reserve price of the active policy, milli-credits per GPU-hour.",
    )
    trips = _Family(
        "gpumarket_guardrail_trips_total",
        "counter",
        "Guardrail breaches, by whether the policy was rolled back.",
    )
    last = (
        Round.objects.filter(
            status__in=[Round.Status.SETTLED, Round.Status.FINISHED], settled_at__isnull=False
        )
        .order_by("-settled_at")
        .first()
    )
    if last is not None:
        seconds = (last.diagnostics or {}).get("total_seconds")
        if isinstance(seconds, int | float):
            clear.add(seconds)
        if last.cleared_at is not None:
            settle.add(max((last.settled_at - last.cleared_at).total_seconds(), 0.0))
        settled_at.add(last.settled_at.timestamp())
        unmet.add(_unmet_gpus(last))
    oldest = (
        Round.objects.filter(status__in=[Round.Status.OPEN, Round.Status.CLOSED], closes_at__lt=now)
        .order_by("closes_at")
        .values_list("closes_at", flat=True)
        .first()
    )
    overdue.add((now - oldest).total_seconds() if oldest else 0)
    active = PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE).first()
    for slug in Tier.objects.filter(active=True).order_by("slug").values_list("slug", flat=True):
        reserve.add(active.reserve_for(slug) if active else 0, tier=slug)
    counts = dict(
        AuditEvent.objects.filter(action__in=list(GUARDRAIL_ACTIONS))
        .values_list("action")
        .annotate(n=Count("id"))
    )
    for action, outcome in GUARDRAIL_ACTIONS.items():
        trips.add(counts.get(action, 0), outcome=outcome)
    return [clear, settle, settled_at, unmet, overdue, reserve, trips]


def _unmet_gpus(rnd: Round) -> int:
    """GPUs the round's bids (not its backfill's) asked for and did not win."""
    asked = (
        Bid.objects.filter(round=rnd, backfill__isnull=True)
        .exclude(status=Bid.Status.CANCELLED)
        .aggregate(n=Sum("quantity"))["n"]
        or 0
    )
    won = (
        Allocation.objects.filter(round=rnd, bid__backfill__isnull=True)
        .exclude(status=Allocation.Status.REVOKED)
        .aggregate(n=Sum("gpus"))["n"]
        or 0
    )
    return max(asked - won, 0)


def operator_families() -> list[_Family]:
    return [*gpu_families(), *team_families(), *market_families()]
