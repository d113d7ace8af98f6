"""Beat's periodic telemetry ticks. Each scans the database for what is due, so a lost or
doubled tick delays work or repeats a no-op, never corrupts it."""

from __future__ import annotations

from celery import shared_task

from telemetry import services
from telemetry.services.energy import allocations_energy_meter, gpus_power_cap_check
from telemetry.services.idle import idle_reclaim_scan
from telemetry.services.upkeep import ROLLUP_BATCHES


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
    """Beat, every minute: roll up raw samples; once the rollup has caught up, meter the
    energy of allocations whose window ended and check the tiers' power caps."""
    result = services.samples_rollup()
    metered = flagged = 0
    if result.batches < ROLLUP_BATCHES:
        metered = len(allocations_energy_meter())
        flagged = len(gpus_power_cap_check())
    return {
        "minutes": result.minutes,
        "samples_purged": result.samples_purged,
        "allocations_metered": metered,
        "gpus_over_power_cap": flagged,
    }


@shared_task(name="telemetry.idle_reclaim")
def idle_reclaim() -> dict[str, int]:
    """Beat, every minute: notice idle won GPUs, reclaim the ones still idle after the grace."""
    report = idle_reclaim_scan()
    return {
        "noticed": len(report.noticed),
        "reclaimed": len(report.reclaimed),
        "withdrawn": len(report.withdrawn),
    }
