"""Spare GPUs as arithmetic: idle reclaim, backfill sub-rounds and failure refunds. Pure
Python (no Django), so the platform's services (market/services/reclaim.py, backfill.py and
failures.py, telemetry/services/idle.py) and the simulator (market/simulator/spare.py) run
the same rules.

Units: money in milli-credits, prices in milli-credits per GPU-hour, times in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from core.money import cost_ceil, cost_floor

# The idle scan (beat, ``telemetry.idle_reclaim``) looks at every placed GPU once a minute.
IDLE_SCAN_SECONDS = 60
# A backfill sub-round runs every this many minutes of a window (policy params, 1-60).
DEFAULT_BACKFILL_MINUTES = 5
# Not worth a sub-round (nor a restart) for less of the window than this.
MIN_SECONDS_LEFT = 120


@dataclass(frozen=True)
class IdlePolicy:
    """A tier's idle-reclaim settings (policy params ``idle_reclaim``)."""

    below_pct: int  # idle while every sample stays below this utilisation
    idle_minutes: int  # idle this long: the team gets a notice
    grace_minutes: int  # still idle this much longer: reclaimed
    refund_pct: int  # share of the unused time's price refunded

    @property
    def idle(self) -> timedelta:
        return timedelta(minutes=self.idle_minutes)

    @property
    def grace(self) -> timedelta:
        return timedelta(minutes=self.grace_minutes)

    def may_notice(self, *, seconds_left: float) -> bool:
        """Whether a notice given with ``seconds_left`` of the window left can end in a
        reclaim: the grace must run out before the window does."""
        return self.grace_minutes * 60 < seconds_left


def reclaim_refund(*, price: int, unused_seconds: int, refund_pct: int, room: int) -> int:
    """What a team gets back for one reclaimed GPU: ``refund_pct`` % of its price for the
    window's unused seconds, never more than ``room`` (what it still pays net)."""
    amount = cost_floor(gpus=1, price=price, seconds=unused_seconds) * refund_pct // 100
    return max(min(amount, room), 0)


def reclaim_time(
    *,
    idle_from: float,
    busy_again: float | None,
    window_end: float,
    policy: IdlePolicy,
    scan_seconds: float = IDLE_SCAN_SECONDS,
) -> float | None:
    """When a GPU idle from ``idle_from`` until ``busy_again`` (None: to the window's end) is
    reclaimed by a scan every ``scan_seconds``, times counted from the window's start; None
    if it is not. The first scan that sees it idle for ``idle_minutes`` gives the notice,
    unless the grace would outlast the window; work back by the end of the grace withdraws
    it; the first scan after the grace reclaims it."""
    noticed = math.ceil((idle_from + policy.idle_minutes * 60) / scan_seconds) * scan_seconds
    if noticed >= window_end or not policy.may_notice(seconds_left=window_end - noticed):
        return None
    reclaimed = noticed + policy.grace_minutes * 60
    if busy_again is not None and busy_again <= reclaimed:
        return None
    return reclaimed


def subround_skip(*, seconds_left: float, since_last: float | None, every_seconds: float) -> str:
    """Why no backfill sub-round runs now ("" if one does): too little of the window left,
    or the last sub-round of the window (``since_last`` seconds ago) too recent."""
    if seconds_left < MIN_SECONDS_LEFT:
        return "the window is nearly over"
    if since_last is not None and since_last < every_seconds:
        return "the last sub-round was too recent"
    return ""


def subround_times(*, window_seconds: float, every_seconds: float) -> list[float]:
    """The sub-rounds of a window whose clock ticks at least every ``every_seconds``: at its
    start, then each ``every_seconds`` while ``subround_skip`` lets one run."""
    times: list[float] = []
    at = 0.0
    while not subround_skip(
        seconds_left=window_seconds - at,
        since_last=at - times[-1] if times else None,
        every_seconds=every_seconds,
    ):
        times.append(at)
        at += every_seconds
    return times


def backfill_quantity(
    *, gpus: int, min_gpus: int, gpu_seconds_left: int | None, seconds: int
) -> int | None:
    """GPUs an order asks for in a sub-round of ``seconds`` left: its gang size, an elastic
    order (min_gpus < gpus) only what the work it still wants fills; None if it wants no
    more."""
    if gpu_seconds_left is None:
        return gpus
    if gpu_seconds_left <= 0:
        return None
    if min_gpus < gpus:
        return max(min_gpus, min(gpus, -(-gpu_seconds_left // seconds)))
    return gpus


def backfill_escrow(*, quantity: int, values: Mapping[str, int], seconds: int) -> int:
    """What a sub-round bid holds: its GPUs at its highest value for the time left."""
    return cost_ceil(gpus=quantity, price=max(values.values()), seconds=seconds)


def backfill_charge(*, gpus: int, price: int, limit: int, seconds: int) -> int:
    """What a sub-round award costs: its GPUs at min(price, its value) for the time left."""
    return cost_floor(gpus=gpus, price=min(price, limit), seconds=seconds)


def failure_refund(*, charge: int, lost: int, window: int, room: int) -> int:
    """The pro-rata refund of an allocation that could not run for ``lost`` of its
    ``window`` (same unit), never more than ``room``."""
    pro_rata = charge * lost // window if window else charge
    return max(min(pro_rata, room), 0)
