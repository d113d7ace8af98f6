"""Energy: what each GPU used, from its cumulative energy counter, rolled up per minute, per
allocation (and so per team, tier and round), and the tiers' power caps checked.

The agent sends NVML's total-energy counter (or, without one, its own integral of power) as
``energy_j``, joules since the counter started. Energy used is the rise of the counter from
one sample of a GPU to the next. A reading below the one before it means the counter was
reset (a driver reload, an agent restart): that step counts nothing and the count goes on from
the new reading, so energy is never negative and a reset never charges a counter's history.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.utils import timezone

import audit.services as audit
from market.models import Allocation, Reclaim, Round
from market.services.settlement import allocations_energy_settle
from telemetry.models import Gpu, Sample, SampleMinute

# How long after its window an allocation is metered: the agents' last batches of the window
# (and a short backlog) are in by then, and rolled up by the pass that meters.
METER_DELAY = timedelta(minutes=5)
METER_BATCH = 500
# A GPU whose every minute's average power stays above its tier's cap by more than the
# tolerance for this long is a finding: NVML enforces a limit within a second or two, so
# minutes above it mean the limit was not applied (no root, a board that refuses) or was
# lifted behind the platform's back.
POWER_CAP_MINUTES = 5
POWER_CAP_TOLERANCE = 1.05


def minutes_energy(
    *, gpu_ids: list[int], start: datetime, end: datetime
) -> dict[tuple[int, datetime], float]:
    """Joules each GPU used per minute in ``[start, end)``: each sample counts the rise of
    the counter since the GPU's sample before it (the one before ``start`` included); a fall
    is a reset and counts 0."""
    previous = dict(
        Gpu.objects.filter(pk__in=gpu_ids)
        .annotate(
            before=Subquery(
                Sample.objects.filter(gpu_id=OuterRef("pk"), at__lt=start)
                .order_by("-at")
                .values("energy_j")[:1]
            )
        )
        .values_list("pk", "before")
    )
    used: dict[tuple[int, datetime], float] = defaultdict(float)
    rows = (
        Sample.objects.filter(gpu_id__in=gpu_ids, at__gte=start, at__lt=end)
        .order_by("gpu_id", "at", "id")
        .values_list("gpu_id", "at", "energy_j")
    )
    for gpu_id, at, energy in rows.iterator(chunk_size=10_000):
        last = previous.get(gpu_id)
        minute = at.replace(second=0, microsecond=0)
        if last is not None and energy > last:
            used[gpu_id, minute] += energy - last
        else:
            used[gpu_id, minute] += 0.0
        previous[gpu_id] = energy
    return dict(used)


def allocations_energy_meter(*, now: datetime | None = None) -> list[Allocation]:
    """Meter every placed allocation whose window ended at least METER_DELAY ago and is not
    metered yet: the joules its GPUs used in its window (their minute rollups), charged at
    its tier's energy price by the market's ``allocations_energy_settle``.

    Call after ``samples_rollup`` (the beat task does). Rounds voided or failed are not
    metered: their allocations were taken back whole."""
    now = now or timezone.now()
    allocations = list(
        Allocation.objects.filter(
            energy_j__isnull=True,
            ends_at__lte=now - METER_DELAY,
            round__status__in=[Round.Status.SETTLED, Round.Status.FINISHED],
        )
        .exclude(placement=[])
        .order_by("ends_at", "pk")
        .only("pk", "placement", "starts_at", "ends_at")[:METER_BATCH]
    )
    if not allocations:
        return []
    uuids = {p["uuid"] for a in allocations for p in a.placement}
    gpu_of = dict(Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "pk"))
    # A GPU reclaimed idle (docs/capacity.md "Idle reclaim") stays in its allocation's
    # placement but is backfilled to other work: its energy is the allocation's only until
    # it was reclaimed.
    reclaimed = {
        (allocation_id, uuid): at
        for allocation_id, uuid, at in Reclaim.objects.filter(
            allocation__in=allocations,
            status=Reclaim.Status.RECLAIMED,
            reclaimed_at__isnull=False,
        ).values_list("allocation_id", "gpu_uuid", "reclaimed_at")
    }
    metered: dict[int, int] = {}
    for allocation in allocations:
        spans = Q()
        for placed in allocation.placement:
            gpu = gpu_of.get(placed["uuid"])
            if gpu is None:
                continue
            end = min(
                allocation.ends_at,
                reclaimed.get((allocation.pk, placed["uuid"]), allocation.ends_at),
            )
            spans |= Q(gpu_id=gpu, minute__gte=allocation.starts_at, minute__lt=end)
        joules = (
            SampleMinute.objects.filter(spans).aggregate(total=Sum("energy_j"))["total"] or 0.0
            if spans
            else 0.0
        )
        # Whole joules, rounded down: a charge is never for energy not measured.
        metered[allocation.pk] = max(int(joules), 0)
    return allocations_energy_settle(metered=metered, now=now)


@transaction.atomic
def gpus_power_cap_check(*, now: datetime | None = None) -> list[Gpu]:
    """Flag GPUs drawing above their tier's power cap: every minute of the last
    POWER_CAP_MINUTES (all reported) averaging over cap x POWER_CAP_TOLERANCE. A finding is
    audited (``gpu.power_over_cap``) once and shown on the fleet page; it clears, audited,
    when a minute keeps to the cap again. Returns the GPUs newly flagged."""
    now = now or timezone.now()
    since = (now - timedelta(minutes=POWER_CAP_MINUTES)).replace(second=0, microsecond=0)
    capped = list(
        Gpu.objects.select_for_update(no_key=True, of=("self",))
        .filter(Q(tier__power_cap_w__isnull=False) | Q(over_power_cap=True))
        .select_related("tier", "node")
        .order_by("pk")
    )
    if not capped:
        return []
    minutes: dict[int, list[float]] = defaultdict(list)
    for gpu_id, power in (
        SampleMinute.objects.filter(gpu__in=capped, minute__gte=since, minute__lt=now)
        .order_by("gpu_id", "minute")
        .values_list("gpu_id", "power_avg")
    ):
        minutes[gpu_id].append(power)
    flagged = []
    for gpu in capped:
        cap = gpu.tier.power_cap_w
        seen = minutes.get(gpu.pk, [])
        over = (
            cap is not None
            and len(seen) >= POWER_CAP_MINUTES
            and all(power > cap * POWER_CAP_TOLERANCE for power in seen)
        )
        if over == gpu.over_power_cap:
            continue
        gpu.over_power_cap = over
        gpu.over_power_cap_since = since if over else None
        gpu.save(update_fields=["over_power_cap", "over_power_cap_since"])
        audit.record(
            actor="telemetry",
            action="gpu.power_over_cap" if over else "gpu.power_within_cap",
            target=gpu,
            after={
                "tier": gpu.tier.slug,
                "power_cap_w": cap,
                "power_avg_w": [round(p, 1) for p in seen],
                "minutes": POWER_CAP_MINUTES,
            },
        )
        if over:
            flagged.append(gpu)
    return flagged
