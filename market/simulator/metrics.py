"""What a simulation reports per policy, as the scheduling papers define it.

Per job:
- JCT = finish - arrival;
- contention N = the average number of jobs in the system (arrived, not finished, itself
  included) over the job's own time in the system, [arrival, finish];
- finish-time fairness rho = JCT / (steps / the job's rate alone on 1/N of every GPU type)
  (Themis; Gavel's finish_time_fairness uses the same ratio). rho <= 1: the job did at least
  as well as on its fair share of the cluster, had it been alone on it;
- short: the job needs less than one round even alone on its fastest GPU type. Scheduling in
  rounds alone makes such a job's rho large (it waits for a boundary, then may hold GPUs it
  no longer needs), so rho figures are given for the other jobs, and short jobs apart;
- an hour or more: the job needs at least an hour alone on its fastest GPU type (the worst
  rho over these is also given);
- preemptions: times its running gang was stopped or moved (``engine.py``).

Per policy: mean and p95 JCT (all finished jobs), makespan (first arrival to last finish),
worst rho and the share of jobs with rho > 1, the worst rho over jobs of an hour or more,
preemptions per job (mean, max, total), utilisation (GPU-time used / offered over the
rounds in which some job was in the system), and per tenant: Jain's index of the tenants'
normalised shares per round and credits spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean

import numpy as np

from market.simulator.engine import JobOutcome, SimResult
from market.simulator.policies import equal_share_rate

HOUR = 3600.0  # seconds


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def jain_index(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def contention(outcomes: list[JobOutcome], *, end: float) -> dict[int, float]:
    """Average number of jobs in the system over each finished job's [arrival, finish].

    n(t) is piecewise constant, so its integral F is piecewise linear with knots at the
    arrivals and finishes; a job's average is (F(finish) - F(arrival)) / JCT. A job still
    unfinished counts as in the system until ``end``.
    """
    starts = np.array([o.job.arrival for o in outcomes])
    stops = np.array([end if o.finish is None else o.finish for o in outcomes])
    knots = np.unique(np.concatenate([starts, stops]))
    delta = np.zeros(len(knots))
    np.add.at(delta, np.searchsorted(knots, starts), 1)
    np.add.at(delta, np.searchsorted(knots, stops), -1)
    count = np.cumsum(delta)[:-1]  # jobs in the system on [knots[k], knots[k + 1])
    area = np.concatenate([[0.0], np.cumsum(count * np.diff(knots))])
    result: dict[int, float] = {}
    for o in outcomes:
        if o.finish is not None and o.finish > o.job.arrival:
            inside = np.interp(o.finish, knots, area) - np.interp(o.job.arrival, knots, area)
            result[o.job.id] = float(inside / (o.finish - o.job.arrival))
    return result


@dataclass(frozen=True)
class JobFairness:
    contention: float  # N
    isolated: float  # seconds: steps / rate on 1/N of every type
    rho: float
    short: bool
    hour: bool  # needs an hour or more alone on its fastest type


def job_fairness(result: SimResult) -> dict[int, JobFairness]:
    """rho and its parts for every finished job."""
    tiers = result.config.tiers
    round_seconds = result.config.round_minutes * 60.0
    end = max(
        [r.start + round_seconds for r in result.rounds] + [o.job.arrival for o in result.jobs]
    )
    n = contention(result.jobs, end=end)
    fairness: dict[int, JobFairness] = {}
    for o in result.jobs:
        if o.jct is None:
            continue
        job = o.job
        isolated = job.steps / equal_share_rate(job, tiers, n[job.id])
        alone = job.steps / max(job.throughput[t] for t in tiers)
        fairness[job.id] = JobFairness(
            contention=n[job.id],
            isolated=isolated,
            rho=o.jct / isolated,
            short=alone < round_seconds,
            hour=alone >= HOUR,
        )
    return fairness


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    finished: int
    tenants: int  # distinct tenants among the jobs
    rounds: int
    plans: int  # times the policy was asked for a plan
    utilisation: float
    jct_mean_h: float
    jct_p95_h: float
    makespan_h: float
    rho_worst: float  # over finished jobs that are not short
    rho_over_one: float  # share of those with rho > 1
    short_jobs: int
    short_rho_worst: float
    contention_mean: float  # average N over finished jobs
    jain: float
    spend: dict[int, int]  # tenant -> milli-credits
    solve_seconds: float
    wall_seconds: float
    extrapolated_jobs: int
    shrunk_jobs: int
    rho_worst_hour: float = math.nan  # over finished jobs of an hour or more
    preemptions_mean: float = 0.0  # per job
    preemptions_max: int = 0
    preemptions_total: int = 0
    restart_seconds: int = 0  # the restart cost it ran with

    @property
    def spend_total(self) -> int:
        return sum(self.spend.values())


def _round_jain(
    tenant_gpus: dict[int, float], demand: dict[int, int], capacity: float
) -> float | None:
    """Jain's index of tenants' normalised shares: GPUs won / min(demand, equal split)."""
    if len(demand) < 2:
        return None
    fair = capacity / len(demand)
    shares = [min(tenant_gpus.get(i, 0.0) / min(d, fair), 1.0) for i, d in demand.items()]
    return jain_index(shares)


def summarise(result: SimResult) -> Summary:
    capacity = sum(result.config.tiers.values())
    round_seconds = result.config.round_minutes * 60.0
    offered = capacity * round_seconds * len(result.rounds)
    busy = sum(r.busy_gpu_seconds for r in result.rounds)
    finished = [o for o in result.jobs if o.jct is not None]
    jcts = [o.jct / 3600 for o in finished if o.jct is not None]
    fairness = job_fairness(result)
    long_rhos = [f.rho for f in fairness.values() if not f.short]
    short_rhos = [f.rho for f in fairness.values() if f.short]
    hour_rhos = [f.rho for f in fairness.values() if f.hour]
    preemptions = [o.preemptions for o in result.jobs]
    jains = [
        j
        for r in result.rounds
        if (j := _round_jain(r.tenant_gpus, r.demand, float(capacity))) is not None
    ]
    spend = {o.job.tenant: 0 for o in result.jobs}
    for record in result.rounds:
        for tenant, amount in record.spend.items():
            spend[tenant] += amount
    first_arrival = min(o.job.arrival for o in result.jobs)
    last_finish = max((o.finish for o in finished if o.finish is not None), default=first_arrival)
    return Summary(
        policy=result.policy,
        jobs=len(result.jobs),
        finished=len(finished),
        tenants=len(spend),
        rounds=len(result.rounds),
        plans=result.plans,
        utilisation=busy / offered if offered else 0.0,
        jct_mean_h=mean(jcts) if jcts else math.nan,
        jct_p95_h=percentile(jcts, 95),
        makespan_h=(last_finish - first_arrival) / 3600,
        rho_worst=max(long_rhos) if long_rhos else math.nan,
        rho_over_one=(sum(r > 1 for r in long_rhos) / len(long_rhos)) if long_rhos else math.nan,
        short_jobs=len(short_rhos),
        short_rho_worst=max(short_rhos) if short_rhos else math.nan,
        contention_mean=mean(f.contention for f in fairness.values()) if fairness else math.nan,
        jain=mean(jains) if jains else 1.0,
        spend=dict(sorted(spend.items())),
        solve_seconds=sum(r.solve_seconds for r in result.rounds),
        wall_seconds=result.wall_seconds,
        extrapolated_jobs=sum(o.job.extrapolated for o in result.jobs),
        shrunk_jobs=result.shrunk_jobs,
        rho_worst_hour=max(hour_rhos) if hour_rhos else math.nan,
        preemptions_mean=mean(preemptions) if preemptions else 0.0,
        preemptions_max=max(preemptions, default=0),
        preemptions_total=sum(preemptions),
        restart_seconds=result.config.restart_seconds,
    )


def as_json(summary: Summary) -> dict[str, object]:
    data = {k: getattr(summary, k) for k in summary.__dataclass_fields__}
    data["spend"] = {str(k): v for k, v in summary.spend.items()}
    data["spend_total"] = summary.spend_total
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()
    }
