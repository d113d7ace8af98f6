"""What a simulation reports per policy.

- utilisation: GPU-time used / GPU-time offered, over the rounds in which some job waited
  (idle stretches of the trace with no job at all say nothing about a policy);
- job completion time (JCT): finish - arrival, mean and 95th percentile, hours;
- finish-time fairness rho = JCT / the job's completion time alone on 1/N of every tier
  (N tenants), including the same wait for the first round boundary; the worst rho and the
  share of jobs with rho > 1.05;
- Jain's index: per round, across the tenants with work waiting, of each tenant's GPUs won
  divided by the lesser of its demand and an equal split of the cluster; averaged over rounds
  with at least two such tenants;
- credits spent per tenant (milli-credits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean

from market.simulator.engine import SimResult

RHO_SLACK = 1.05


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    finished: int
    rounds: int
    utilisation: float
    jct_mean_h: float
    jct_p95_h: float
    rho_worst: float
    rho_over_share: float  # share of finished jobs with rho > RHO_SLACK
    jain: float
    spend: dict[int, int]  # tenant -> milli-credits
    makespan_h: float
    solve_seconds: float
    wall_seconds: float
    extrapolated_jobs: int

    @property
    def spend_total(self) -> int:
        return sum(self.spend.values())


def summarise(result: SimResult) -> Summary:
    capacity = sum(result.config.tiers.values())
    round_seconds = result.config.round_minutes * 60.0
    offered = capacity * round_seconds * len(result.rounds)
    busy = sum(r.busy_gpu_seconds for r in result.rounds)
    finished = [o for o in result.jobs if o.finish is not None]
    jcts = [o.jct / 3600 for o in finished]
    rhos = [o.rho for o in finished]
    jains = [r.jain for r in result.rounds if r.jain is not None]
    spend = {i: 0 for i in range(result.config.tenants)}
    for record in result.rounds:
        for tenant, amount in record.spend.items():
            spend[tenant] += amount
    first_arrival = min(o.job.arrival for o in result.jobs)
    last_finish = max((o.finish for o in finished), default=first_arrival)
    return Summary(
        policy=result.policy,
        jobs=len(result.jobs),
        finished=len(finished),
        rounds=len(result.rounds),
        utilisation=busy / offered if offered else 0.0,
        jct_mean_h=mean(jcts) if jcts else math.nan,
        jct_p95_h=percentile(jcts, 95),
        rho_worst=max(rhos) if rhos else math.nan,
        rho_over_share=(sum(r > RHO_SLACK for r in rhos) / len(rhos)) if rhos else math.nan,
        jain=mean(jains) if jains else 1.0,
        spend=spend,
        makespan_h=(last_finish - first_arrival) / 3600,
        solve_seconds=sum(r.solve_seconds for r in result.rounds),
        wall_seconds=result.wall_seconds,
        extrapolated_jobs=sum(o.job.extrapolated for o in result.jobs),
    )


def _credits(milli: int) -> str:
    return f"{milli / 1000:,.1f}"


def markdown_table(summaries: list[Summary]) -> str:
    """The comparison table (one row per policy) in Markdown."""
    tenants = sorted({t for s in summaries for t in s.spend})
    head = (
        "| policy | jobs finished | rounds | utilisation | mean JCT (h) | p95 JCT (h) | worst rho | "
        "jobs rho > 1.05 | Jain | " + " | ".join(f"spent t{t} (credits)" for t in tenants) + " |"
    )
    rule = "|" + "---|" * (9 + len(tenants))
    rows = [
        f"| {s.policy} | {s.finished}/{s.jobs} | {s.rounds} | {s.utilisation:.3f} | {s.jct_mean_h:.2f} | "
        f"{s.jct_p95_h:.2f} | {s.rho_worst:.2f} | {s.rho_over_share:.1%} | {s.jain:.3f} | "
        + " | ".join(_credits(s.spend.get(t, 0)) for t in tenants)
        + " |"
        for s in summaries
    ]
    return "\n".join([head, rule, *rows])


def as_json(summary: Summary) -> dict:
    data = {k: getattr(summary, k) for k in summary.__dataclass_fields__}
    data["spend"] = {str(k): v for k, v in summary.spend.items()}
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()
    }
