"""The round loop: jobs arrive, a policy plans their shares, rounds realise the plan.

Time is cut into rounds of ``round_minutes`` (Gavel uses 6, the platform 60). A job that
arrives during a round takes part from the next round boundary on (bidding for a round
closes before it starts, as on the platform). A policy is asked for a plan of time
fractions (``policies/base.py``) when the set of jobs in the system changes (a job arrived
or finished), or every round for the queue baselines; each round realises the current plan
under the job model (``realise.py``), jobs advance and may finish part-way through a round
(their GPUs then stay idle until the next round: the cost of scheduling in rounds). Rounds
in which no job is in the system are skipped.

Restarts (gang model): a job whose gang ran in the previous round and this round runs on
another type or not at all is preempted (``market.orders.preempted``); the next round in
which it runs, its first ``restart_seconds`` make no progress (it restarts from its last
checkpoint). The cost applies to every policy alike, since every plan is realised the same
way (in leases long enough that a restart costs at most 1 % of a run, ``realise.py``); our
mechanisms also see it in their bids (``policies/market.py``).

Charges (market mechanisms): min(price, the job's limit) per GPU-hour x the GPU-hours the
job actually ran, in milli-credits; the baselines charge the reserve price the same way.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from market.orders import preempted
from market.simulator.errors import SimulationError
from market.simulator.policies import POLICIES, Plan, PolicySpec, Tiers, View, limit_prices
from market.simulator.policies.queues import DEFAULT_HALF_LIFE_HOURS
from market.simulator.realise import Ledger, fluid_gpus, lease_rounds, place_gangs
from market.simulator.spare import IDLE_STRETCHES, IdleStretch, play_window
from market.simulator.trace import Job
from market.spare import IdlePolicy

JobModel = Literal["gang", "fluid"]
JOB_MODELS: tuple[JobModel, ...] = ("gang", "fluid")


@dataclass(frozen=True)
class SimConfig:
    tiers: dict[str, int]  # GPU type -> GPUs offered each round
    tenants: int = 4
    round_minutes: float = 60.0
    max_rounds: int | None = None  # rounds in which something ran; None = until every job ends
    job_model: JobModel = "gang"
    reserve: dict[str, int] = field(default_factory=dict)  # milli-credits per GPU-hour
    max_share_pct: dict[str, int] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    weights: tuple[int, ...] | None = None  # tenant entitlements; None = equal
    half_life_hours: float = DEFAULT_HALF_LIFE_HOURS  # fair-share usage decay
    restart_seconds: int = 0  # progress a preempted gang loses when it next runs
    # Idle GPUs within a window (spare.py): a job's share of held time it computes when the
    # trace does not say, where its idle stretch lies, the idle-reclaim policy of every type
    # (None: never reclaimed) and the backfill sub-rounds' interval (None: no backfill).
    utilisation: float = 1.0
    idle_stretch: IdleStretch = "end"
    idle_reclaim: IdlePolicy | None = None
    backfill_minutes: int | None = None

    @property
    def spare(self) -> bool:
        """Whether windows are played with idle stretches, reclaim or backfill (spare.py)."""
        return (
            self.utilisation < 1
            or self.idle_reclaim is not None
            or self.backfill_minutes is not None
        )

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
        if self.job_model not in JOB_MODELS:
            raise SimulationError(
                f"job model must be one of {', '.join(JOB_MODELS)}, got {self.job_model!r}"
            )
        if not (self.half_life_hours > 0):
            raise SimulationError(
                f"fair-share half-life must be positive, got {self.half_life_hours} hours"
            )
        if self.restart_seconds < 0:
            raise SimulationError(
                f"restart cost must be 0 or more seconds, got {self.restart_seconds}"
            )
        if self.restart_seconds >= self.round_minutes * 60:
            raise SimulationError(
                f"restart cost ({self.restart_seconds} s) must be shorter than a round "
                f"({self.round_minutes * 60:g} s)"
            )
        if self.restart_seconds and self.job_model != "gang":
            raise SimulationError("a restart cost needs the gang job model (--job-model gang)")
        if not (0 < self.utilisation <= 1):
            raise SimulationError(f"utilisation must be in (0, 1], got {self.utilisation}")
        if self.idle_stretch not in IDLE_STRETCHES:
            raise SimulationError(
                f"idle stretch must be one of {', '.join(IDLE_STRETCHES)}, got {self.idle_stretch!r}"
            )
        if self.backfill_minutes is not None and not 1 <= self.backfill_minutes <= 60:
            raise SimulationError(
                f"backfill interval must be 1-60 minutes, got {self.backfill_minutes}"
            )
        if self.spare and self.job_model != "gang":
            raise SimulationError(
                "idle stretches, reclaim and backfill need the gang job model (--job-model gang)"
            )
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
    spend: int  # milli-credits
    preemptions: int = 0  # times its running gang was stopped or moved
    lost_seconds: float = 0.0  # seconds its gang ran without progress, restarting

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.arrival


@dataclass(frozen=True)
class RoundRecord:
    start: float  # seconds
    waiting_jobs: int  # jobs in the system during the round
    demand: dict[int, int]  # tenant -> GPUs its jobs' gangs ask for
    allocated: dict[str, float]  # GPUs per tier
    busy_gpu_seconds: float  # GPU-seconds actually used (jobs may finish part-way)
    tenant_gpus: dict[int, float]
    placed: dict[int, str]  # gang model: job id -> the one type its gang ran on
    prices: dict[str, float]  # milli-credits per GPU-hour
    spend: dict[int, int]  # tenant -> milli-credits
    solve_seconds: float  # 0 in rounds that reuse the previous plan
    reclaimed_gpus: int = 0  # GPUs reclaimed idle within the window (spare.py)
    backfill_gpus: int = 0  # GPUs awarded by its backfill sub-rounds
    backfill_busy_gpu_seconds: float = 0.0  # of busy_gpu_seconds, on backfilled GPUs


@dataclass(frozen=True)
class SimResult:
    policy: str
    config: SimConfig
    jobs: list[JobOutcome]
    rounds: list[RoundRecord]
    wall_seconds: float
    plans: int  # times the policy was asked
    shrunk_jobs: int  # gangs larger than every type, run on the largest type instead


def fit_gangs(jobs: list[Job], tiers: Tiers) -> tuple[list[Job], int]:
    """A gang larger than every GPU type could never run whole on one type. Such a job is
    run on a gang as large as the largest type instead, doing the same work per GPU-second
    (the trace's throughputs for big gangs are already scaled linearly from 8 GPUs)."""
    largest = max(tiers.values())
    fitted: list[Job] = []
    for job in jobs:
        if job.scale <= largest:
            fitted.append(job)
            continue
        factor = largest / job.scale
        fitted.append(
            dataclasses.replace(
                job,
                scale=largest,
                throughput={t: v * factor for t, v in job.throughput.items()},
            )
        )
    return fitted, sum(j.scale > largest for j in jobs)


@dataclass
class _State:
    """What the rounds have done so far, by job id and tenant."""

    remaining: dict[int, float]  # steps still to run
    first_run: dict[int, float] = field(default_factory=dict)  # seconds
    finish: dict[int, float] = field(default_factory=dict)  # seconds
    spend: dict[int, int] = field(default_factory=dict)  # milli-credits per job
    usage: dict[int, float] = field(default_factory=dict)  # tenant -> decayed GPU-seconds
    usage_clock: float = 0.0  # seconds; when ``usage`` was last decayed
    running: dict[int, str] = field(default_factory=dict)  # job -> type, last round
    limits: dict[int, dict[str, int]] = field(default_factory=dict)  # job -> milli-credits/GPU-h
    preemptions: dict[int, int] = field(default_factory=dict)  # job -> times stopped or moved
    restarting: set[int] = field(default_factory=set)  # preempted, not yet run again
    lost_seconds: dict[int, float] = field(default_factory=dict)  # job -> seconds restarting


def _play_round(
    *,
    active: list[Job],
    start: float,
    plan: Plan,
    config: SimConfig,
    state: _State,
    ledger: Ledger,
    spare: bool = False,
    mechanism: str | None = None,
) -> RoundRecord:
    """Realise ``plan`` for one round and advance the ``active`` jobs (updates ``state``)."""
    tiers: Tiers = config.tiers
    placed, gpus = _plan_realise(active, plan=plan, config=config, state=state, ledger=ledger)
    decay = 0.5 ** ((start - state.usage_clock) / (config.half_life_hours * 3600.0))
    state.usage = {t: u * decay for t, u in state.usage.items()}
    state.usage_clock = start
    if spare:
        return _spare_round(
            active=active,
            start=start,
            plan=plan,
            placed=placed,
            config=config,
            state=state,
            mechanism=mechanism,
        )
    busy = 0.0
    allocated = {t: 0.0 for t in tiers}
    tenant_gpus: dict[int, float] = {}
    demand: dict[int, int] = {}
    spend: dict[int, int] = {}
    for job in active:
        demand[job.tenant] = demand.get(job.tenant, 0) + job.scale
        held = gpus[job.id]
        used_seconds = _job_advance(job, held=held, start=start, config=config, state=state)
        limits = state.limits.get(job.id)
        if limits is None:
            limits = state.limits[job.id] = limit_prices(job, tiers)
        charge = 0.0
        for t, x in held.items():
            allocated[t] += x
            busy += x * used_seconds
            tenant_gpus[job.tenant] = tenant_gpus.get(job.tenant, 0.0) + x
            state.usage[job.tenant] = state.usage.get(job.tenant, 0.0) + x * used_seconds
            charge += min(plan.prices.get(t, 0.0), limits[t]) * x * used_seconds / 3600.0
        if round(charge):
            state.spend[job.id] += round(charge)
            spend[job.tenant] = spend.get(job.tenant, 0) + round(charge)
    state.running = placed
    return RoundRecord(
        start=start,
        waiting_jobs=len(active),
        demand=demand,
        allocated=allocated,
        busy_gpu_seconds=busy,
        tenant_gpus=tenant_gpus,
        placed=placed,
        prices=dict(plan.prices),
        spend=spend,
        solve_seconds=0.0,
    )


def _plan_realise(
    active: list[Job], *, plan: Plan, config: SimConfig, state: _State, ledger: Ledger
) -> tuple[dict[int, str], dict[int, dict[str, float]]]:
    """The plan's fractions as GPUs: {job id: tier} of the gangs placed (gang model; empty
    for the fluid model), and {job id: {tier: GPUs}} each job holds this round."""
    tiers: Tiers = config.tiers
    round_seconds = config.round_minutes * 60.0
    if config.job_model != "gang":
        return {}, fluid_gpus(active, plan.fractions, tiers)
    placed = place_gangs(
        active,
        plan.fractions,
        tiers,
        ledger,
        running=state.running,
        restart_share=config.restart_seconds / round_seconds,
        lease=lease_rounds(config.restart_seconds, round_seconds),
        remaining=state.remaining,
        round_seconds=round_seconds,
    )
    ledger.record(placed)
    gpus = {j.id: ({placed[j.id]: float(j.scale)} if j.id in placed else {}) for j in active}
    return placed, gpus


def _job_advance(
    job: Job, *, held: dict[str, float], start: float, config: SimConfig, state: _State
) -> float:
    """Count a preemption if the job lost the gang it ran on, and run it on ``held`` for
    the round (less a restart's lost time); returns the seconds it used the GPUs."""
    round_seconds = config.round_minutes * 60.0
    before = state.running.get(job.id)
    if before is not None and preempted(
        held={before: job.scale}, won={t: round(x) for t, x in held.items()}
    ):
        state.preemptions[job.id] = state.preemptions.get(job.id, 0) + 1
        state.restarting.add(job.id)
    rate = sum(job.throughput[t] * x / job.scale for t, x in held.items())
    if rate <= 0:
        return round_seconds
    state.first_run.setdefault(job.id, start)
    lost = 0.0
    if job.id in state.restarting:
        state.restarting.discard(job.id)
        lost = float(config.restart_seconds)
        state.lost_seconds[job.id] = state.lost_seconds.get(job.id, 0.0) + lost
    if state.remaining[job.id] <= rate * (round_seconds - lost):
        used_seconds = lost + state.remaining[job.id] / rate
        state.finish[job.id] = start + used_seconds
        state.remaining[job.id] = 0.0
        return used_seconds
    state.remaining[job.id] -= rate * (round_seconds - lost)
    return round_seconds


def _spare_round(
    *,
    active: list[Job],
    start: float,
    plan: Plan,
    placed: dict[int, str],
    config: SimConfig,
    state: _State,
    mechanism: str | None,
) -> RoundRecord:
    """A gang round played with idle stretches, idle reclaim and backfill (spare.py)."""
    demand: dict[int, int] = {}
    for job in active:
        demand[job.tenant] = demand.get(job.tenant, 0) + job.scale
        before = state.running.get(job.id)
        won = {placed[job.id]: job.scale} if job.id in placed else {}
        if before is not None and preempted(held={before: job.scale}, won=won):
            state.preemptions[job.id] = state.preemptions.get(job.id, 0) + 1
            state.restarting.add(job.id)
        if job.id not in state.limits:
            state.limits[job.id] = limit_prices(job, config.tiers)
    holdings, spend = play_window(
        active=active,
        placed=placed,
        prices=plan.prices,
        start=start,
        config=config,
        state=state,
        mechanism=mechanism,
    )
    tenant_of = {job.id: job.tenant for job in active}
    allocated = {t: 0.0 for t in config.tiers}
    tenant_gpus: dict[int, float] = {}
    for holding in holdings:
        if not holding.backfill:
            allocated[holding.gpu_type] += holding.gpus
            tenant = tenant_of[holding.job]
            tenant_gpus[tenant] = tenant_gpus.get(tenant, 0.0) + holding.gpus
    state.running = placed
    return RoundRecord(
        start=start,
        waiting_jobs=len(active),
        demand=demand,
        allocated=allocated,
        busy_gpu_seconds=sum(h.gpus * h.busy_seconds for h in holdings),
        tenant_gpus=tenant_gpus,
        placed=placed,
        prices=dict(plan.prices),
        spend=spend,
        solve_seconds=0.0,
        reclaimed_gpus=sum(h.gpus for h in holdings if h.reclaimed_at is not None),
        backfill_gpus=sum(h.gpus for h in holdings if h.backfill),
        backfill_busy_gpu_seconds=sum(h.gpus * h.busy_seconds for h in holdings if h.backfill),
    )


def simulate(jobs: list[Job], *, policy: str, config: SimConfig) -> SimResult:
    """Replay ``jobs`` under ``policy`` and return per-job and per-round outcomes."""
    spec = _policy_of(policy, config=config)
    planner = spec.make()
    tiers: Tiers = dict(config.tiers)
    jobs, shrunk, spare = _jobs_prepared(jobs, tiers=tiers, config=config)
    round_seconds = config.round_minutes * 60.0
    weights = config.weights or tuple([1] * config.tenants)

    order = sorted(jobs, key=lambda j: (j.arrival, j.id))
    state = _State(remaining={j.id: float(j.steps) for j in order}, spend={j.id: 0 for j in order})
    ledger = Ledger()
    records: list[RoundRecord] = []
    plan: Plan | None = None
    plans = 0
    changed = True
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
            changed = True
        if not active:
            clock += 1
            continue
        if config.max_rounds is not None and len(records) >= config.max_rounds:
            break
        solve_seconds = 0.0
        if plan is None or changed or spec.every_round:
            view = _view(
                start, active=active, tiers=tiers, state=state, weights=weights, config=config
            )
            t0 = time.perf_counter()
            new_plan = planner(view)
            solve_seconds = time.perf_counter() - t0
            ledger.new_plan(plan.fractions if plan is not None else {})
            plan, plans, changed = new_plan, plans + 1, False

        record = _play_round(
            active=active,
            start=start,
            plan=plan,
            config=config,
            state=state,
            ledger=ledger,
            spare=spare,
            mechanism=policy if spec.market else None,
        )
        records.append(dataclasses.replace(record, solve_seconds=solve_seconds))
        clock += 1
        if any(j.id in state.finish for j in active):
            active, changed = _finished_retire(active, state=state, ledger=ledger), True
        if active and record.busy_gpu_seconds == 0:
            # Nothing ran: the same jobs would get the same GPUs next round, so only an
            # arrival can change the outcome. Jump to it, or stop if none is left.
            if next_arrival == len(order):
                raise _never_served(active, policy=policy)
            clock = max(clock, math.ceil(order[next_arrival].arrival / round_seconds))

    return SimResult(
        policy=policy,
        config=config,
        jobs=_job_outcomes(order, state=state),
        rounds=records,
        wall_seconds=time.perf_counter() - started,
        plans=plans,
        shrunk_jobs=shrunk,
    )


def _jobs_prepared(
    jobs: list[Job], *, tiers: Tiers, config: SimConfig
) -> tuple[list[Job], int, bool]:
    """The jobs checked and, under the gang model, fitted to the tiers; how many were shrunk
    to fit, and whether idle GPUs are played (``spare``)."""
    _jobs_check(jobs, tiers=tiers, config=config)
    shrunk = 0
    if config.job_model == "gang":
        jobs, shrunk = fit_gangs(jobs, tiers)
    spare = config.spare or any(j.utilisation is not None for j in jobs)
    if spare and config.job_model != "gang":
        raise SimulationError("a trace's utilisation needs the gang job model (--job-model gang)")
    return jobs, shrunk, spare


def _view(
    start: float,
    *,
    active: list[Job],
    tiers: Tiers,
    state: _State,
    weights: tuple[int, ...],
    config: SimConfig,
) -> View:
    """What the planner sees at the round starting at ``start`` (seconds)."""
    return View(
        now=start,
        jobs=tuple(active),
        tiers=tiers,
        remaining=state.remaining,
        running=state.running,
        usage=state.usage,
        weights=weights,
        round_seconds=config.round_minutes * 60.0,
        restart_seconds=config.restart_seconds,
        reserve=config.reserve,
        max_share_pct=config.max_share_pct,
        params=config.params,
    )


def _finished_retire(active: list[Job], *, state: _State, ledger: Ledger) -> list[Job]:
    """The active jobs less those that finished, which the ledger forgets."""
    for job in active:
        if job.id in state.finish:
            ledger.forget(job.id)
    return [j for j in active if j.id not in state.finish]


def _policy_of(policy: str, *, config: SimConfig) -> PolicySpec:
    """The policy's spec, once the configuration is valid and fits it."""
    config.validate()
    if policy not in POLICIES:
        raise SimulationError(
            f"unknown policy {policy!r}; choose from {', '.join(sorted(POLICIES))}"
        )
    spec = POLICIES[policy]
    if config.backfill_minutes is not None and not spec.market:
        raise SimulationError(
            f"backfill sub-rounds clear with the market's mechanisms; {policy} is a baseline "
            "(choose welfare, fisher or maxmin)"
        )
    return spec


def _jobs_check(jobs: list[Job], *, tiers: Tiers, config: SimConfig) -> None:
    """Every job has a throughput on every tier and belongs to a simulated tenant."""
    for job in jobs:
        missing = [t for t in tiers if t not in job.throughput]
        if missing:
            raise SimulationError(f"job {job.id} has no throughput for tier(s) {missing}")
        if job.tenant >= config.tenants:
            raise SimulationError(
                f"job {job.id} belongs to tenant {job.tenant}, but only {config.tenants} "
                "tenants are simulated"
            )


def _never_served(active: list[Job], *, policy: str) -> SimulationError:
    stuck = sorted(active, key=lambda j: j.id)[:5]
    return SimulationError(
        f"{len(active)} job(s) can never be served under {policy}, e.g. "
        + ", ".join(f"job {j.id} ({j.job_type}, {j.scale} GPUs at once)" for j in stuck)
        + "; offer more GPUs or check the throughputs"
    )


def _job_outcomes(order: list[Job], *, state: _State) -> list[JobOutcome]:
    return [
        JobOutcome(
            job=job,
            first_run=state.first_run.get(job.id),
            finish=state.finish.get(job.id),
            spend=state.spend[job.id],
            preemptions=state.preemptions.get(job.id, 0),
            lost_seconds=state.lost_seconds.get(job.id, 0.0),
        )
        for job in order
    ]
