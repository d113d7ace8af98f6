"""Idle GPUs within a window: a job's busy and idle stretches, idle reclaim and backfill.

The platform's rules, from ``market.spare`` (the same functions its services run):

- **Busy and idle.** A job computes only part of the time it holds GPUs: its utilisation u
  (the trace's eighth field where present, else ``SimConfig.utilisation``). Over a holding of
  length L its gang computes u x L in all, as two stretches around one idle stretch of
  (1 - u) x L: ``idle_stretch="end"`` puts all the work first (the job is done with its GPUs
  for the window, as a notebook left open or a job waiting on its next input),
  ``"middle"`` splits it in halves (its owner comes back later in the window). After its
  work is finished a gang is idle to the window's end.
- **Idle reclaim** (``SimConfig.idle_reclaim``, an ``IdlePolicy``): an idle stretch is
  noticed by the minute scan after ``idle_minutes``, withdrawn if work comes back within the
  grace, reclaimed after it (``market.spare.reclaim_time``). A reclaimed gang's GPUs are the
  platform's to the window's end: work its owner starts on them later is paused, so the rest
  of its work in the window is lost (no recall right). Its owner is refunded
  ``market.spare.reclaim_refund`` for each GPU.
- **Backfill** (``SimConfig.backfill_minutes``): at the sub-round times of
  ``market.spare.subround_times``, the pool (per type, GPUs no holding has now: unsold, or
  released by a reclaim) is offered to the jobs that hold no GPUs in the window and still
  have work, each bidding its gang (``market.spare.backfill_quantity``) at its values per
  type, cleared by the round's own mechanism with whole GPUs and gangs all or nothing
  (``market.clearing.clear``), as the platform's sub-rounds are. An award runs from the
  sub-round to the window's end (preemptible terms: stopped when the window ends, counted as
  a preemption) and pays ``market.spare.backfill_charge`` for the time left; it is itself
  subject to idle reclaim.

What the platform does and this model does not: nodes (an award here needs only enough GPUs
of its type, not on one node), scans and sub-rounds that run late, and charges in the
window's round (pay per use of the GPU-time held up to the work's end, as the rest of the
simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from market import clearing
from market.clearing.instance import inputs
from market.simulator.errors import SimulationError
from market.simulator.policies.base import limit_prices
from market.simulator.trace import Job
from market.spare import (
    IdlePolicy,
    backfill_charge,
    backfill_quantity,
    reclaim_refund,
    reclaim_time,
    subround_times,
)

IdleStretch = Literal["end", "middle"]
IDLE_STRETCHES: tuple[IdleStretch, ...] = ("end", "middle")
MILLI = 1000


@dataclass(frozen=True)
class Holding:
    """One gang's GPUs of one type from ``start`` to the window's end (seconds in the window)."""

    job: int
    gpu_type: str
    gpus: int
    start: float
    busy: tuple[tuple[float, float], ...]  # the stretches its gang computed
    progress_seconds: float  # busy time that advanced the work (restart time excluded)
    finish: float | None  # when its work finished, if it did
    reclaimed_at: float | None  # when the platform reclaimed the gang's GPUs
    backfill: bool = False

    @property
    def busy_seconds(self) -> float:
        return sum(end - start for start, end in self.busy)

    def holds(self, at: float, window: float) -> bool:
        return self.start <= at < (self.reclaimed_at if self.reclaimed_at is not None else window)


def busy_stretches(
    *, start: float, end: float, utilisation: float, idle_stretch: IdleStretch
) -> list[tuple[float, float]]:
    """Where a job with this utilisation computes while holding GPUs over [start, end)."""
    length = end - start
    if utilisation >= 1 or length <= 0:
        return [(start, end)] if length > 0 else []
    lead = utilisation if idle_stretch == "end" else utilisation / 2
    first = (start, start + lead * length)
    second = (start + (lead + 1 - utilisation) * length, end)
    return [s for s in (first, second) if s[1] - s[0] > 1e-9]


def _clip(stretches: list[tuple[float, float]], at: float) -> list[tuple[float, float]]:
    return [(s, min(e, at)) for s, e in stretches if s < at]


def hold(
    *,
    job: int,
    gpu_type: str,
    gpus: int,
    start: float,
    window: float,
    utilisation: float,
    idle_stretch: IdleStretch,
    need_seconds: float,
    lost_seconds: float,
    policy: IdlePolicy | None,
    backfill: bool = False,
) -> Holding:
    """What a gang does with GPUs held from ``start`` to ``window`` (the window's end): it
    computes in its busy stretches, the first ``lost_seconds`` of them restarting, until
    ``need_seconds`` of progress finish its work; an idle stretch may be reclaimed."""
    stretches = busy_stretches(
        start=start, end=window, utilisation=utilisation, idle_stretch=idle_stretch
    )
    finish = None
    needed = lost_seconds + need_seconds
    done = 0.0
    for s, e in stretches:
        if done + (e - s) >= needed:
            finish = s + (needed - done)
            stretches = _clip(stretches, finish)
            break
        done += e - s
    reclaimed = None
    if policy is not None:
        edges = [start, *(x for s, e in stretches for x in (s, e)), window]
        for idle_from, busy_again in zip(edges[::2], edges[1::2], strict=True):
            if busy_again - idle_from <= 0:
                continue
            reclaimed = reclaim_time(
                idle_from=idle_from,
                busy_again=None if busy_again >= window else busy_again,
                window_end=window,
                policy=policy,
            )
            if reclaimed is not None:
                break
    if reclaimed is not None:
        stretches = _clip(stretches, reclaimed)
        if finish is not None and finish > reclaimed:
            finish = None
    busy = sum(e - s for s, e in stretches)
    return Holding(
        job=job,
        gpu_type=gpu_type,
        gpus=gpus,
        start=start,
        busy=tuple(stretches),
        progress_seconds=max(busy - lost_seconds, 0.0),
        finish=finish,
        reclaimed_at=reclaimed,
        backfill=backfill,
    )


def holding_charge(holding: Holding, *, price: float, window: float, refund_pct: int) -> int:
    """Milli-credits a holding pays at ``price`` per GPU-hour (the lesser of the round's price
    and the job's value), net of a reclaim refund.

    A round's winner pays for the GPU-time it holds up to its work's end (the simulator's
    rule); a backfill award pays the platform's ``backfill_charge`` for the time left. A
    reclaim before the work's end refunds ``reclaim_refund`` per GPU."""
    whole = math.floor(price)  # milli-credits are whole; a fraction is never charged
    if holding.backfill:
        charge = backfill_charge(
            gpus=holding.gpus, price=whole, limit=whole, seconds=round(window - holding.start)
        )
    else:
        until = holding.finish if holding.finish is not None else window
        # The simulator's round rule (engine.py), so a window with no idle time charges as
        # a round does.
        charge = round(price * holding.gpus * (until - holding.start) / 3600.0)
    reclaimed = holding.reclaimed_at
    if reclaimed is not None and (holding.backfill or holding.finish is None):
        per_gpu = reclaim_refund(
            price=whole,
            unused_seconds=round(window - reclaimed),
            refund_pct=refund_pct,
            room=charge // holding.gpus,
        )
        charge -= per_gpu * holding.gpus
    return charge


def subround_awards(
    *,
    waiting: list[Job],
    pool: dict[str, int],
    tiers: dict[str, int],
    seconds: float,
    mechanism: str,
    reserve: dict[str, int],
    max_share_pct: dict[str, int],
    weights: tuple[int, ...],
    params: dict[str, Any],
) -> tuple[dict[int, str], dict[str, float]]:
    """One backfill sub-round: {job id: the type its gang won}, and the prices (milli-credits
    per GPU-hour). Each waiting job bids its whole gang at its values on the pool's types."""
    offered = {t: n for t, n in pool.items() if n > 0}
    bids = []
    for job in waiting:
        quantity = backfill_quantity(
            gpus=job.scale, min_gpus=job.scale, gpu_seconds_left=None, seconds=round(seconds)
        )
        values = limit_prices(job, tiers)
        limits = {t: values[t] / MILLI for t in offered if values[t] >= reserve.get(t, 0)}
        if quantity is None or not limits:
            continue
        bids.append(
            inputs.Bid(
                id=f"j{job.id:07d}",
                tenant=f"t{job.tenant}",
                quantity=float(quantity),
                min_quantity=float(quantity if quantity > 1 else 0),
                limits=limits,
            )
        )
    if not offered or not bids:
        return {}, {}
    instance = inputs.Instance(
        tiers=tuple(
            inputs.Tier(
                name=t,
                capacity=n,
                reserve_price=reserve.get(t, 0) / MILLI,
                max_share=max_share_pct.get(t, 100) / 100,
            )
            for t, n in offered.items()
        ),
        tenants=tuple(
            inputs.Tenant(name=f"t{i}", weight=float(weights[i]))
            for i in sorted({job.tenant for job in waiting})
        ),
        bids=tuple(bids),
    )
    try:
        result = clearing.clear(instance, mechanism=mechanism, params=params or None)
    except clearing.ClearingError as exc:
        raise SimulationError(f"{mechanism}: a backfill sub-round did not clear: {exc}") from exc
    won: dict[int, str] = {}
    for allocation in result.allocations:
        if allocation.gpus > 0:
            won[int(allocation.bid[1:])] = allocation.tier
    # Milli-credits per GPU-hour, rounded down, as the platform prices a round.
    return won, {t: math.floor(float(p) * MILLI) for t, p in result.prices.items()}


def play_window(
    *,
    active: list[Job],
    placed: dict[int, str],
    prices: dict[str, float],
    start: float,
    config: Any,
    state: Any,
    mechanism: str | None,
) -> tuple[list[Holding], dict[int, int]]:
    """The holdings of one window (its round's winners ``placed``, then what the sub-rounds
    award) with the jobs advanced in ``state`` (the engine's), and each tenant's spend."""
    played = _Window(config=config, state=state, start=start)
    by_id = {job.id: job for job in active}
    for job_id, gpu_type in placed.items():
        played.run(by_id[job_id], gpu_type, 0.0, prices.get(gpu_type, 0.0), backfill=False)
    if config.backfill_minutes is None or mechanism is None:
        return played.holdings, played.spend
    for at in subround_times(
        window_seconds=played.window, every_seconds=config.backfill_minutes * 60
    ):
        won, sub_prices = _subround(played, active=active, at=at, mechanism=mechanism)
        for job_id, gpu_type in sorted(won.items()):
            played.run(by_id[job_id], gpu_type, at, sub_prices.get(gpu_type, 0.0), backfill=True)
    for holding in played.holdings:
        if holding.backfill and holding.finish is None:
            # Preemptible terms: its work is stopped when the window ends.
            state.preemptions[holding.job] = state.preemptions.get(holding.job, 0) + 1
            state.restarting.add(holding.job)
    return played.holdings, played.spend


@dataclass
class _Window:
    """One window being played: its holdings so far and each tenant's spend."""

    config: Any
    state: Any
    start: float
    holdings: list[Holding] = field(default_factory=list)
    spend: dict[int, int] = field(default_factory=dict)

    @property
    def window(self) -> float:
        return self.config.round_minutes * 60.0

    @property
    def policy(self) -> IdlePolicy | None:
        return self.config.idle_reclaim

    def run(self, job: Job, gpu_type: str, at: float, price: float, *, backfill: bool) -> None:
        """Give ``job`` its gang of ``gpu_type`` from ``at``: its holding, its progress (less
        a restart it owes), and its charge at min(price, limit) less refunds."""
        config, state = self.config, self.state
        lost = 0.0
        if job.id in state.restarting:
            state.restarting.discard(job.id)
            lost = float(config.restart_seconds)
            state.lost_seconds[job.id] = state.lost_seconds.get(job.id, 0.0) + lost
        rate = job.throughput[gpu_type]
        holding = hold(
            job=job.id,
            gpu_type=gpu_type,
            gpus=job.scale,
            start=at,
            window=self.window,
            utilisation=job.utilisation if job.utilisation is not None else config.utilisation,
            idle_stretch=config.idle_stretch,
            need_seconds=state.remaining[job.id] / rate,
            lost_seconds=lost,
            policy=self.policy,
            backfill=backfill,
        )
        self.holdings.append(holding)
        state.first_run.setdefault(job.id, self.start + at)
        if holding.finish is not None:
            state.finish[job.id] = self.start + holding.finish
            state.remaining[job.id] = 0.0
        else:
            state.remaining[job.id] -= rate * holding.progress_seconds
        limit = state.limits[job.id][gpu_type]
        refund_pct = self.policy.refund_pct if self.policy is not None else 0
        charge = holding_charge(
            holding, price=min(price, limit), window=self.window, refund_pct=refund_pct
        )
        if charge:
            state.spend[job.id] += charge
            self.spend[job.tenant] = self.spend.get(job.tenant, 0) + charge
        state.usage[job.tenant] = state.usage.get(job.tenant, 0.0) + (
            holding.gpus * holding.busy_seconds
        )


def _subround(
    played: _Window, *, active: list[Job], at: float, mechanism: str
) -> tuple[dict[int, str], dict[str, float]]:
    """The sub-round at ``at``: the GPUs no holding has then, offered to the jobs that hold
    none in the window and still have work; nothing when either is missing."""
    config, state = played.config, played.state
    pool = {
        t: n
        - sum(h.gpus for h in played.holdings if h.gpu_type == t and h.holds(at, played.window))
        for t, n in config.tiers.items()
    }
    holding_jobs = {h.job for h in played.holdings}
    waiting = [j for j in active if j.id not in holding_jobs and j.id not in state.finish]
    if not waiting or not any(pool.values()):
        return {}, {}
    return subround_awards(
        waiting=waiting,
        pool=pool,
        tiers=config.tiers,
        seconds=played.window - at,
        mechanism=mechanism,
        reserve=dict(config.reserve),
        max_share_pct=dict(config.max_share_pct),
        weights=config.weights or tuple([1] * config.tenants),
        params=dict(config.params),
    )
