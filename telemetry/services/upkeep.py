"""Periodic upkeep: stale nodes marked unhealthy, raw samples rolled up per minute and purged."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

import audit.services as audit
from telemetry.models import Gpu, IngestBatch, Node, Sample, SampleMinute
from telemetry.services.energy import minutes_energy
from telemetry.services.nodes import _gpus_unhealthy, failed_gpus_sweep, tier_capacity_refresh


@transaction.atomic
def nodes_health_check(*, now: datetime | None = None) -> list[Node]:
    """Mark nodes silent for GPUMARKET_NODE_STALE_SECONDS unhealthy, measure every tier's
    supply again (GPUs that left, and work of longer windows that started or ended), and
    refund and move the allocations on a silent node or a failed GPU. Returns the nodes
    marked."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS)
    stale = list(
        Node.objects.select_for_update(no_key=True)
        .filter(healthy=True, last_seen_at__lt=cutoff)
        .order_by("pk")
    )
    for node in stale:
        node.healthy = False
        node.save(update_fields=["healthy"])
        _gpus_unhealthy(Gpu.objects.filter(node=node))
        audit.record(
            actor="telemetry",
            action="node.unhealthy",
            target=node,
            after={
                "last_seen_at": node.last_seen_at.isoformat() if node.last_seen_at else None,
                "stale_seconds": settings.GPUMARKET_NODE_STALE_SECONDS,
            },
        )
    tier_capacity_refresh()
    # Work on a silent node could not run since the node's last batch; the sweep also
    # catches work settled onto a GPU while it was failing.
    failed_gpus_sweep(now=now)
    return stale


@dataclass(frozen=True)
class RollupResult:
    batches: int
    minutes: int
    samples_purged: int
    batches_purged: int


ROLLUP_BATCHES = 5000


@transaction.atomic
def samples_rollup(*, now: datetime | None = None) -> RollupResult:
    """Fold new raw samples into per-minute rows, then drop raw samples (and batch records)
    older than GPUMARKET_SAMPLE_RETENTION_HOURS.

    A minute is recomputed from all its raw samples whenever a batch touches it, so late
    batches from an agent's backlog land in the right minute and a rerun changes nothing.
    """
    now = now or timezone.now()
    batches = list(
        IngestBatch.objects.select_for_update(skip_locked=True)
        .filter(rolled_up=False)
        .order_by("pk")
        .values("pk", "node_id", "first_at", "last_at")[:ROLLUP_BATCHES]
    )
    with_samples = [b for b in batches if b["first_at"] is not None]
    minutes = _minutes_fold(with_samples) if with_samples else 0
    if batches:
        IngestBatch.objects.filter(pk__in=[b["pk"] for b in batches]).update(rolled_up=True)
    cutoff = now - timedelta(hours=settings.GPUMARKET_SAMPLE_RETENTION_HOURS)
    samples_purged, _ = Sample.objects.filter(at__lt=cutoff).delete()
    batches_purged, _ = IngestBatch.objects.filter(received_at__lt=cutoff, rolled_up=True).delete()
    return RollupResult(
        batches=len(batches),
        minutes=minutes,
        samples_purged=samples_purged,
        batches_purged=batches_purged,
    )


def _minutes_fold(batches: list[dict]) -> int:
    """Recompute every minute the ``batches`` (each with samples) touch on their nodes' GPUs
    from all its raw samples, and upsert it; returns how many minutes were written."""
    start = min(b["first_at"] for b in batches).replace(second=0, microsecond=0)
    end = max(b["last_at"] for b in batches).replace(second=0, microsecond=0)
    gpu_ids = list(
        Gpu.objects.filter(node_id__in={b["node_id"] for b in batches}).values_list("pk", flat=True)
    )
    rows = _minute_aggregates(gpu_ids, start=start, end=end + timedelta(minutes=1))
    used = minutes_energy(gpu_ids=gpu_ids, start=start, end=end + timedelta(minutes=1))
    aggregates = [
        SampleMinute(
            gpu_id=r["gpu_id"],
            minute=r["minute"],
            samples=r["n"],
            utilization_avg=r["util_avg"],
            utilization_max=r["util_max"],
            memory_used_avg=r["mem_avg"],
            memory_used_max=r["mem_max"],
            power_avg=r["power_avg"],
            power_max=r["power_max"],
            temperature_max=r["temp_max"],
            energy_j_last=r["energy_last"],
            energy_j=used.get((r["gpu_id"], r["minute"]), 0.0),
        )
        for r in rows
    ]
    SampleMinute.objects.bulk_create(
        aggregates,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["gpu", "minute"],
        update_fields=[
            "samples",
            "utilization_avg",
            "utilization_max",
            "memory_used_avg",
            "memory_used_max",
            "power_avg",
            "power_max",
            "temperature_max",
            "energy_j_last",
            "energy_j",
        ],
    )
    return len(aggregates)


def _minute_aggregates(gpu_ids: list[int], *, start: datetime, end: datetime) -> QuerySet:
    """Per GPU and minute in [start, end): the raw samples' count, means and maxima."""
    return (
        Sample.objects.filter(gpu_id__in=gpu_ids, at__gte=start, at__lt=end)
        .annotate(minute=TruncMinute("at"))
        .values("gpu_id", "minute")
        .annotate(
            n=Count("id"),
            util_avg=Avg("utilization_pct"),
            util_max=Max("utilization_pct"),
            mem_avg=Avg("memory_used_mib"),
            mem_max=Max("memory_used_mib"),
            power_avg=Avg("power_w"),
            power_max=Max("power_w"),
            temp_max=Max("temperature_c"),
            energy_last=Max("energy_j"),
        )
        .order_by()
    )
