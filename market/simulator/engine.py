"""The round loop: jobs arrive, bid, are allocated GPUs by a policy, progress and finish.

Time is cut into rounds of ``round_minutes``. A job that arrives during a round bids from the
next round boundary on (bidding for a round closes before it starts, as on the platform).
Each round every unfinished job bids for its gang (``scale`` GPUs) with a limit price per GPU
type proportional to its throughput there; the policy decides who gets what; each job then
advances at its fluid rate for the round and may finish part-way through it. Rounds in which
no job is waiting are skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from market.simulator.errors import SimulationError
from market.simulator.policies import POLICIES, Demand, RoundAllocation, Tiers
from market.simulator.trace import Job

# Limit price per GPU-hour of a job on its slowest GPU type, milli-credits; faster types are
# worth proportionally more (a job values a GPU type by its throughput on it).
BASE_PRICE = 1000


@dataclass(frozen=True)
class SimConfig:
    tiers: dict[str, int]  # GPU type -> GPUs offered each round
    tenants: int = 4
    round_minutes: float = 60.0
    max_rounds: int | None = None  # rounds in which something ran; None = until every job ends
    divisible: bool = True
    reserve: dict[str, int] = field(default_factory=dict)  # milli-credits per GPU-hour
    max_share_pct: dict[str, int] = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    weights: tuple[int, ...] | None = None  # tenant entitlements; None = equal

    def validate(self) -> None:
        if not self.tiers:
            raise SimulationError("need at least one tier, e.g. --tiers k80=8,p100=8,v100=8")
        for name, gpus in self.tiers.items():
            if gpus < 1:
                raise SimulationError(f"tier {name} needs at least one GPU, got {gpus}")
        if self.tenants < 1:
            raise SimulationError(f"need at least one tenant, got {self.tenants}")
        if not (self.round_minutes > 0):
            raise SimulationError(
                f"round length must be positive, got {self.round_minutes} minutes"
            )
        if self.max_rounds is not None and self.max_rounds < 1:
            raise SimulationError(f"--rounds must be at least 1, got {self.max_rounds}")
        if self.weights is not None and (
            len(self.weights) != self.tenants or min(self.weights) < 1
        ):
            raise SimulationError(
                f"need {self.tenants} positive tenant weights, got {self.weights}"
            )


@dataclass(frozen=True)
class JobOutcome:
    job: Job
    first_run: float | None  # seconds; start of the first round in which it got GPUs
    finish: float | None  # seconds; None if the simulation stopped first
    isolated: float  # completion time alone on 1/N of every tier, seconds
    spend: int  # milli-credits

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.arrival

    @property
    def rho(self) -> float | None:
        """Finish-time fairness: time under the policy / time on an equal share."""
        return None if self.jct is None else self.jct / self.isolated


@dataclass(frozen=True)
class RoundRecord:
    start: float  # seconds
    waiting_jobs: int
    demand: dict[str, int]  # GPUs asked for, per tenant (by index as text)
    allocated: dict[str, float]  # GPUs per tier
    busy_gpu_seconds: float  # GPU-seconds actually used (jobs may finish part-way)
    tenant_gpus: dict[int, float]
    prices: dict[str, float]
    spend: dict[int, int]
    jain: float | None  # across tenants with demand; None with fewer than two
    solve_seconds: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimResult:
    policy: str
    config: SimConfig
    jobs: list[JobOutcome]
    rounds: list[RoundRecord]
    wall_seconds: float


def isolated_rate(job: Job, tiers: Tiers, tenants: int) -> float:
    """Steps/s of ``job`` alone on 1/N of every tier: its gang filled from its fastest type."""
    left = float(job.scale)
    rate = 0.0
    for gpu_type in sorted(tiers, key=lambda t: (-job.throughput[t], t)):
        take = min(left, tiers[gpu_type] / tenants)
        rate += job.throughput[gpu_type] * take / job.scale
        left -= take
        if left <= 0:
            break
    return rate


def limit_prices(job: Job, tiers: Tiers) -> dict[str, int]:
    """The job's limit per GPU-hour on each type, milli-credits: ``BASE_PRICE`` x speed-up."""
    slowest = min(job.throughput[t] for t in tiers)
    return {t: max(1, round(BASE_PRICE * job.throughput[t] / slowest)) for t in tiers}


def jain_index(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def _round_jain(
    tenant_gpus: dict[int, float], demand: dict[int, int], capacity: float
) -> float | None:
    """Jain's index of tenants' normalised shares: GPUs won / min(demand, equal split).

    Only tenants with work waiting count; a tenant given all it asked for (or its equal split
    of the cluster) scores 1.
    """
    if len(demand) < 2:
        return None
    fair = capacity / len(demand)
    shares = [min(tenant_gpus.get(i, 0.0) / min(d, fair), 1.0) for i, d in demand.items()]
    return jain_index(shares)


@dataclass
class _Progress:
    """What the rounds have done to the jobs so far, by job id."""

    remaining: dict[int, float]  # steps still to run
    first_run: dict[int, float] = field(default_factory=dict)  # seconds
    finish: dict[int, float] = field(default_factory=dict)  # seconds
    spend: dict[int, int] = field(default_factory=dict)  # milli-credits


def _round_play(
    *,
    active: list[Job],
    start: float,
    allocate: Callable[..., RoundAllocation],
    tiers: Tiers,
    config: SimConfig,
    weights: tuple[int, ...],
    progress: _Progress,
) -> tuple[RoundRecord, RoundAllocation, list[Job]]:
    """Clear one round for the ``active`` jobs and advance them through it.

    Updates ``progress`` in place; returns the round's record, the policy's allocation and the
    jobs still unfinished at the end of the round.
    """
    round_seconds = config.round_minutes * 60.0
    demands = [
        Demand(job=j, limits=limit_prices(j, tiers), weight=weights[j.tenant]) for j in active
    ]
    t0 = time.perf_counter()
    outcome: RoundAllocation = allocate(
        demands=demands,
        tiers=tiers,
        hours=round_seconds / 3600.0,
        tenants=config.tenants,
        weights=weights,
        reserve=config.reserve,
        max_share_pct=config.max_share_pct,
        params=config.params,
        divisible=config.divisible,
    )
    solve_seconds = time.perf_counter() - t0

    remaining = progress.remaining
    busy = 0.0
    allocated = {t: 0.0 for t in tiers}
    tenant_gpus: dict[int, float] = {}
    tenant_demand: dict[int, int] = {}
    spend: dict[int, int] = {}
    still_active: list[Job] = []
    for job in active:
        tenant_demand[job.tenant] = tenant_demand.get(job.tenant, 0) + job.scale
        gpus = {t: x for t, x in outcome.gpus.get(job.id, {}).items() if x > 1e-9}
        rate = job.rate(gpus)
        used_seconds = round_seconds
        if rate > 0:
            progress.first_run.setdefault(job.id, start)
            if remaining[job.id] <= rate * round_seconds:
                used_seconds = remaining[job.id] / rate
                progress.finish[job.id] = start + used_seconds
                remaining[job.id] = 0.0
            else:
                remaining[job.id] -= rate * round_seconds
        for t, x in gpus.items():
            allocated[t] += x
            busy += x * used_seconds
            tenant_gpus[job.tenant] = tenant_gpus.get(job.tenant, 0.0) + x
        charge = outcome.charges.get(job.id, 0)
        if charge:
            progress.spend[job.id] += charge
            spend[job.tenant] = spend.get(job.tenant, 0) + charge
        if job.id not in progress.finish:
            still_active.append(job)
    record = RoundRecord(
        start=start,
        waiting_jobs=len(active),
        demand={str(i): d for i, d in sorted(tenant_demand.items())},
        allocated=allocated,
        busy_gpu_seconds=busy,
        tenant_gpus=tenant_gpus,
        prices=dict(outcome.prices),
        spend=spend,
        jain=_round_jain(tenant_gpus, tenant_demand, float(sum(tiers.values()))),
        solve_seconds=solve_seconds,
        notes=outcome.notes,
    )
    return record, outcome, still_active


def simulate(jobs: list[Job], *, policy: str, config: SimConfig) -> SimResult:
    """Replay ``jobs`` under ``policy`` and return per-job and per-round outcomes."""
    config.validate()
    if policy not in POLICIES:
        raise SimulationError(
            f"unknown policy {policy!r}; choose from {', '.join(sorted(POLICIES))}"
        )
    allocate = POLICIES[policy]
    tiers: Tiers = dict(config.tiers)
    for job in jobs:
        missing = [t for t in tiers if t not in job.throughput]
        if missing:
            raise SimulationError(f"job {job.id} has no throughput for tier(s) {missing}")
    if not config.divisible:
        too_big = [j for j in jobs if j.scale > sum(tiers.values())]
        if too_big:
            raise SimulationError(
                f"{len(too_big)} job(s) need more GPUs at once than the tiers offer in all "
                f"({sum(tiers.values())}), e.g. job {too_big[0].id} needs {too_big[0].scale}; with "
                "whole GPUs they could never run: offer more GPUs, or clear divisibly"
            )
    round_seconds = config.round_minutes * 60.0
    weights = config.weights or tuple([1] * config.tenants)

    order = sorted(jobs, key=lambda j: (j.arrival, j.id))
    progress = _Progress(
        remaining={j.id: float(j.steps) for j in order}, spend={j.id: 0 for j in order}
    )
    records: list[RoundRecord] = []
    next_arrival = 0
    active: list[Job] = []
    clock = 0
    started = time.perf_counter()

    while next_arrival < len(order) or active:
        if not active:
            # Skip idle time: jump to the first round boundary at or after the next arrival.
            clock = max(clock, math.ceil(order[next_arrival].arrival / round_seconds))
        start = clock * round_seconds
        while next_arrival < len(order) and order[next_arrival].arrival <= start:
            active.append(order[next_arrival])
            next_arrival += 1
        if not active:
            clock += 1
            continue
        if config.max_rounds is not None and len(records) >= config.max_rounds:
            break

        record, outcome, active = _round_play(
            active=active,
            start=start,
            allocate=allocate,
            tiers=tiers,
            config=config,
            weights=weights,
            progress=progress,
        )
        records.append(record)
        clock += 1
        if active and not any(outcome.gpus.values()):
            # Nothing ran: the same jobs bid the same way next round, so only an arrival can
            # change the outcome. Jump to it, or stop if none is left.
            if next_arrival == len(order):
                stuck = sorted(active, key=lambda j: j.id)[:5]
                raise SimulationError(
                    f"{len(active)} job(s) can never be served under {policy}, e.g. "
                    + ", ".join(f"job {j.id} ({j.job_type}, {j.scale} GPUs at once)" for j in stuck)
                    + "; offer more GPUs, or clear divisibly (without --whole-gpus)"
                )
            clock = max(clock, math.ceil(order[next_arrival].arrival / round_seconds))

    outcomes = []
    for job in order:
        first_boundary = math.ceil(job.arrival / round_seconds) * round_seconds
        isolated = (first_boundary - job.arrival) + job.steps / isolated_rate(
            job, tiers, config.tenants
        )
        outcomes.append(
            JobOutcome(
                job=job,
                first_run=progress.first_run.get(job.id),
                finish=progress.finish.get(job.id),
                isolated=isolated,
                spend=progress.spend[job.id],
            )
        )
    return SimResult(
        policy=policy,
        config=config,
        jobs=outcomes,
        rounds=records,
        wall_seconds=time.perf_counter() - started,
    )
