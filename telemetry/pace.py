"""The pace signal: how hard a training job may push right now (light, moderate, heavy).

Inputs: the allocation's own headroom, from the recent samples of the GPUs its processes
run on, and its tier's spare capacity. Headroom at one moment is

    headroom % = min(100 - utilisation %, 100 - memory used %)

averaged over buckets of ``bucket_seconds`` (utilisation: mean over the GPUs; memory: the
fullest GPU, because one full GPU is what makes a longer sequence fail).

Hysteresis, so short spikes do not flip the mode:
- bands: from moderate, heavy is the target at headroom >= ``heavy_enter_pct`` and light
  below ``light_enter_pct``; heavy is kept while headroom >= ``heavy_exit_pct`` and light
  while it is < ``light_exit_pct`` (exit thresholds sit inside the bands);
- dwell: the mode changes only after the target has differed from it for ``dwell_seconds``
  without a break (a gap in the samples longer than ``max_gap_seconds`` is a break).

Then the tier: below ``tier_spare_heavy_pct`` spare GPUs in the tier, heavy is held at
moderate (a tier with no slack has neighbours sharing hosts, network and storage), and an
allocation that is not running now is light.

The state machine is replayed over the last ``history_seconds`` of samples on every call,
starting from moderate, so the signal needs no stored state: the same samples always give
the same answer, on any web process. The history window is the machine's memory; it must be
several dwell times long.

Pure parts (``PaceConfig``, ``Point``, ``pace_target``, ``pace_step``, ``pace_replay``,
``points_from_samples``, ``pace_decide``) need no database; ``allocation_pace`` reads it.
The endpoint (``AllocationPaceView``) is in telemetry/api/views.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Sum
from django.utils import timezone

from market.models import Allocation, Tier
from telemetry.models import ProcessObservation, Sample


class Mode(StrEnum):
    LIGHT = "light"
    MODERATE = "moderate"
    HEAVY = "heavy"


ORDER = (Mode.LIGHT, Mode.MODERATE, Mode.HEAVY)


@dataclass(frozen=True)
class PaceConfig:
    """Thresholds are headroom percentages; times are seconds."""

    heavy_enter_pct: float = 40.0
    heavy_exit_pct: float = 25.0
    light_enter_pct: float = 10.0
    light_exit_pct: float = 20.0
    dwell_seconds: float = 120.0
    bucket_seconds: float = 10.0
    max_gap_seconds: float = 60.0
    history_seconds: float = 900.0
    tier_spare_heavy_pct: float = 10.0

    def __post_init__(self) -> None:
        if not (
            0
            <= self.light_enter_pct
            < self.light_exit_pct
            <= self.heavy_exit_pct
            < self.heavy_enter_pct
            <= 100
        ):
            raise ValueError(
                "pace thresholds must satisfy 0 <= light_enter < light_exit <= heavy_exit < "
                f"heavy_enter <= 100, got light {self.light_enter_pct}/{self.light_exit_pct}, "
                f"heavy {self.heavy_exit_pct}/{self.heavy_enter_pct}"
            )
        if self.bucket_seconds <= 0 or self.dwell_seconds < 0 or self.max_gap_seconds <= 0:
            raise ValueError("pace bucket and gap must be > 0 seconds and the dwell >= 0")
        if self.history_seconds < 2 * self.dwell_seconds:
            raise ValueError(
                f"pace history ({self.history_seconds} s) must be at least twice the dwell "
                f"({self.dwell_seconds} s), or a sustained shift could fall out of the window"
            )
        if not 0 <= self.tier_spare_heavy_pct <= 100:
            raise ValueError("tier_spare_heavy_pct is a percentage, 0..100")

    @classmethod
    def from_settings(cls) -> PaceConfig:
        """Defaults overridden by ``settings.GPUMARKET_PACE`` (a dict of these field names)."""
        overrides: Mapping[str, Any] = getattr(settings, "GPUMARKET_PACE", {}) or {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ImproperlyConfigured(
                f"GPUMARKET_PACE has unknown keys {unknown}; known keys: {sorted(known)}"
            )
        try:
            return replace(cls(), **{k: float(v) for k, v in overrides.items()})
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"GPUMARKET_PACE is invalid: {exc}") from exc


@dataclass(frozen=True)
class Point:
    """One bucket of the allocation's GPUs: mean utilisation and the fullest GPU's memory."""

    at: datetime
    utilization_pct: float
    memory_pct: float

    @property
    def headroom_pct(self) -> float:
        return max(0.0, min(100.0 - self.utilization_pct, 100.0 - self.memory_pct))


@dataclass(frozen=True)
class PaceState:
    mode: Mode
    since: datetime
    # When the target first differed from ``mode`` without a break; None while they agree.
    pending_since: datetime | None = None
    last_at: datetime | None = None
    switches: int = 0


def pace_target(current: Mode, headroom_pct: float, config: PaceConfig) -> Mode:
    """The mode the headroom points to, seen from ``current`` (hysteresis bands)."""
    if current == Mode.HEAVY and headroom_pct >= config.heavy_exit_pct:
        return Mode.HEAVY
    if current == Mode.LIGHT and headroom_pct < config.light_exit_pct:
        return Mode.LIGHT
    if headroom_pct >= config.heavy_enter_pct:
        return Mode.HEAVY
    if headroom_pct < config.light_enter_pct:
        return Mode.LIGHT
    return Mode.MODERATE


def pace_step(state: PaceState, point: Point, config: PaceConfig) -> PaceState:
    """Advance the machine by one point (points must come in time order)."""
    target = pace_target(state.mode, point.headroom_pct, config)
    if target == state.mode:
        return replace(state, pending_since=None, last_at=point.at)
    # A hole in the samples breaks a run: two readings minutes apart do not show a sustained shift.
    broken = (
        state.last_at is not None
        and (point.at - state.last_at).total_seconds() > config.max_gap_seconds
    )
    pending_since = point.at if state.pending_since is None or broken else state.pending_since
    if (point.at - pending_since).total_seconds() >= config.dwell_seconds:
        return PaceState(mode=target, since=point.at, last_at=point.at, switches=state.switches + 1)
    return replace(state, pending_since=pending_since, last_at=point.at)


def pace_replay(
    points: Iterable[Point], config: PaceConfig, *, initial: Mode = Mode.MODERATE
) -> PaceState | None:
    """Run the machine over ``points`` from ``initial``; None if there are no points."""
    state: PaceState | None = None
    for point in points:
        if state is None:
            state = PaceState(mode=initial, since=point.at, last_at=None)
        state = pace_step(state, point, config)
    return state


def points_from_samples(rows: Iterable[Mapping[str, Any]], *, bucket_seconds: float) -> list[Point]:
    """Bucket raw GPU samples (dicts with at, utilization_pct, memory_used_mib,
    memory_total_mib) into time-ordered points. A bucket is labelled with its start time."""
    buckets: dict[int, tuple[list[float], list[float]]] = {}
    for row in rows:
        at: datetime = row["at"]
        total = row["memory_total_mib"] or 0
        memory_pct = 100.0 * row["memory_used_mib"] / total if total > 0 else 0.0
        key = int(at.timestamp() // bucket_seconds)
        utils, memories = buckets.setdefault(key, ([], []))
        utils.append(float(row["utilization_pct"]))
        memories.append(memory_pct)
    tz = timezone.get_current_timezone() if settings.USE_TZ else None
    return [
        Point(
            at=datetime.fromtimestamp(key * bucket_seconds, tz=tz),
            utilization_pct=sum(utils) / len(utils),
            memory_pct=max(memories),
        )
        for key, (utils, memories) in sorted(buckets.items())
    ]


@dataclass(frozen=True)
class TierSpare:
    slug: str
    offered: int  # GPUs offered: healthy capacity less maintenance
    allocated: int  # GPUs in allocations running now

    @property
    def spare(self) -> int:
        return max(self.offered - self.allocated, 0)

    @property
    def spare_pct(self) -> float:
        return 100.0 * self.spare / self.offered if self.offered else 0.0


@dataclass(frozen=True)
class PaceReading:
    mode: Mode
    since: datetime | None
    reasons: list[str]
    numbers: dict[str, float | int]


def _pct(value: float) -> str:
    return f"{value:.0f}%"


def pace_decide(
    *,
    points: list[Point],
    config: PaceConfig,
    tier: TierSpare,
    running: bool,
    not_running_reason: str = "",
    gpus: int,
    samples: int,
) -> PaceReading:
    """The mode from the replayed machine, the tier cap and the allocation's state, with the
    reasons a person can check against the numbers."""
    state = pace_replay(points, config)
    numbers: dict[str, float | int] = {
        "gpus": gpus,
        "samples": samples,
        "tier_offered_gpus": tier.offered,
        "tier_allocated_gpus": tier.allocated,
        "tier_spare_gpus": tier.spare,
        "tier_spare_pct": round(tier.spare_pct, 1),
        "heavy_enter_pct": config.heavy_enter_pct,
        "heavy_exit_pct": config.heavy_exit_pct,
        "light_enter_pct": config.light_enter_pct,
        "light_exit_pct": config.light_exit_pct,
        "dwell_seconds": config.dwell_seconds,
        "tier_spare_heavy_pct": config.tier_spare_heavy_pct,
    }
    if not running:
        return PaceReading(Mode.LIGHT, None, [not_running_reason], numbers)
    reasons: list[str] = []
    if state is None:
        mode, since = Mode.MODERATE, None
        reasons.append(
            f"no samples from this allocation's GPUs in the last {config.history_seconds:.0f} s "
            "(is the job tagged with GPUMARKET_ALLOCATION?): moderate until telemetry arrives"
        )
    else:
        latest = points[-1]
        numbers.update(
            utilization_pct=round(latest.utilization_pct, 1),
            memory_pct=round(latest.memory_pct, 1),
            headroom_pct=round(latest.headroom_pct, 1),
        )
        mode, since = state.mode, state.since
        reasons.append(
            f"GPU headroom {_pct(latest.headroom_pct)} (utilisation {_pct(latest.utilization_pct)}, "
            f"memory {_pct(latest.memory_pct)} used on the fullest GPU)"
        )
        reasons.append(
            {
                Mode.HEAVY: f"headroom has stayed at or above {config.heavy_exit_pct:.0f}% since heavy began",
                Mode.MODERATE: f"headroom sits between {config.light_enter_pct:.0f}% and "
                f"{config.heavy_enter_pct:.0f}% (or has not stayed outside for {config.dwell_seconds:.0f} s)",
                Mode.LIGHT: f"headroom has stayed below {config.light_exit_pct:.0f}% since light began",
            }[mode]
        )
        if state.pending_since is not None:
            waited = (latest.at - state.pending_since).total_seconds()
            target = pace_target(state.mode, latest.headroom_pct, config)
            numbers["pending_seconds"] = round(waited, 1)
            reasons.append(
                f"headroom points to {target} for {waited:.0f} s of the {config.dwell_seconds:.0f} s "
                "needed to change (short spikes do not flip the mode)"
            )
    if mode == Mode.HEAVY and tier.spare_pct < config.tier_spare_heavy_pct:
        mode = Mode.MODERATE
        reasons.append(
            f"tier {tier.slug} has {tier.spare} of {tier.offered} GPUs spare "
            f"({_pct(tier.spare_pct)}), below {config.tier_spare_heavy_pct:.0f}%: heavy is held at moderate"
        )
    else:
        reasons.append(
            f"tier {tier.slug} has {tier.spare} of {tier.offered} GPUs spare ({_pct(tier.spare_pct)})"
        )
    return PaceReading(mode, since, reasons, numbers)


# Data access ------------------------------------------------------------------------------

RUNNING_STATUSES = (Allocation.Status.ACTIVE,)


def tier_spare_get(*, tier: Tier, at: datetime) -> TierSpare:
    allocated = (
        Allocation.objects.filter(
            tier=tier,
            status__in=[Allocation.Status.ACTIVE, Allocation.Status.PAUSED],
            starts_at__lte=at,
            ends_at__gt=at,
        ).aggregate(n=Sum("gpus"))["n"]
        or 0
    )
    return TierSpare(slug=tier.slug, offered=tier.offered, allocated=allocated)


def _not_running(allocation: Allocation, now: datetime) -> str:
    """Why the allocation has no running work now, or "" if it has."""
    if allocation.status not in RUNNING_STATUSES:
        return f"allocation {allocation.pk} is {allocation.status}: keep the load light"
    if now < allocation.starts_at:
        return f"allocation {allocation.pk} starts at {allocation.starts_at:%Y-%m-%d %H:%M} UTC"
    if now >= allocation.ends_at:
        return f"allocation {allocation.pk} ended at {allocation.ends_at:%Y-%m-%d %H:%M} UTC"
    return ""


def allocation_pace(
    *, allocation: Allocation, now: datetime | None = None, config: PaceConfig | None = None
) -> PaceReading:
    """The pace reading for one allocation (fetched by the caller through tenants.access).

    Its GPUs are those of its tier where the agents last saw a process tagged with it.
    """
    config = config or PaceConfig.from_settings()
    now = now or timezone.now()
    not_running = _not_running(allocation, now)
    gpu_ids = sorted(
        set(
            ProcessObservation.objects.filter(
                allocation_ref=allocation.pk, gpu__tier_id=allocation.tier_id
            ).values_list("gpu_id", flat=True)
        )
    )
    rows: list[dict[str, Any]] = []
    if gpu_ids and not not_running:
        since = max(now - timedelta(seconds=config.history_seconds), allocation.starts_at)
        rows = list(
            Sample.objects.filter(gpu_id__in=gpu_ids, at__gte=since, at__lte=now)
            .order_by("at")
            .values("at", "utilization_pct", "memory_used_mib", "memory_total_mib")
        )
    return pace_decide(
        points=points_from_samples(rows, bucket_seconds=config.bucket_seconds),
        config=config,
        tier=tier_spare_get(tier=allocation.tier, at=now),
        running=not not_running,
        not_running_reason=not_running,
        gpus=len(gpu_ids),
        samples=len(rows),
    )
