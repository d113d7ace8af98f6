"""Beat's periodic telemetry ticks. Each scans the database for what is due, so a lost or
doubled tick delays work or repeats a no-op, never corrupts it."""

from __future__ import annotations

from celery import shared_task

from telemetry import services
from telemetry.services.idle import idle_reclaim_scan


@shared_task(name="telemetry.enforce")
def enforce() -> dict[str, int]:
    report = services.enforce()
    return {
        "issued": len(report.issued),
        "capped_tenants": len(report.capped_tenants),
        "bids_cancelled": report.bids_cancelled,
    }


@shared_task(name="telemetry.nodes_health")
def nodes_health() -> int:
    return len(services.nodes_health_check())


@shared_task(name="telemetry.samples_rollup")
def samples_rollup() -> dict[str, int]:
    result = services.samples_rollup()
    return {"minutes": result.minutes, "samples_purged": result.samples_purged}


@shared_task(name="telemetry.idle_reclaim")
def idle_reclaim() -> dict[str, int]:
    """Beat, every minute: notice idle won GPUs, reclaim the ones still idle after the grace."""
    report = idle_reclaim_scan()
    return {
        "noticed": len(report.noticed),
        "reclaimed": len(report.reclaimed),
        "withdrawn": len(report.withdrawn),
    }
