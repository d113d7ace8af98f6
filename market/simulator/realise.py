"""From a plan's time fractions to what runs in one round.

Two job models:

- ``gang`` (the schedulers' model, the default): each round a job's whole gang of s GPUs
  runs on ONE GPU type or not at all, so progress never adds up across types. Gangs are
  placed the way Gavel's round scheduler places them: every (job, type) with a target
  fraction X > 0 gets priority X / (fraction of the rounds since the plan was made in which
  the job ran on that type), a job that has not run there yet coming first; ties go to the
  larger deficit (time owed, carried across plans), then the larger X. In that order each
  job not yet placed takes s free GPUs of the type if there are that many. Over many rounds
  a job thus receives its target share of each type. GPUs still free afterwards go to the
  unplaced jobs, oldest first, on their fastest type with room (work conservation, as
  Gavel's scheduler also runs jobs with no allocation when workers are left).
  With a restart cost r (seconds; R the round length) the plan's fractions are realised in
  long runs, so that restarts cost little: a gang that starts keeps its type for a *lease*
  of L = ceil(r / (1 % x R)) rounds (17 for 60 s in 6-minute rounds: each restart then costs
  at most 1 % of the run it starts) unless it finishes first or a new plan gives it no share
  of that type; once the lease is over it runs on to its end if its work there would take
  less than r / 1 % (a restart for what is left would cost more than 1 % of that run) and
  that leaves it at most a lease ahead of its planned share there. The other places go by
  priority entitled / (received + 1/2), entitled being target x (rounds + 1) plus what the
  job is owed from earlier plans (negative if it ran past its share: a lease can outlast a
  plan, and the shares hold across plans), so a job not yet run under a new plan is not
  put before every other; an incumbent's priority on its type is multiplied by 1 + r / R,
  its restart value; free GPUs go first to incumbents on the type they ran on. With r = 0 nothing changes (no lease, Gavel's priority).
- ``fluid`` (the relaxation): job m holds X[m, t] x s_m GPUs of every type t at once and
  advances at sum_t T[m, t] X[m, t]; fractional GPUs, types mixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from market.simulator.policies import Fractions, Tiers
from market.simulator.trace import Job

FIRST_TIME = 1e9  # priority multiplier for a (job, type) that has not run since the plan
LEASE_OVERHEAD = 0.01  # with a restart cost, a run lasts until the restart is at most 1 % of it


@dataclass
class Ledger:
    """What each job has received since the current plan was made, and what it is owed."""

    rounds: int = 0  # rounds realised under the current plan
    received: dict[int, dict[str, int]] = field(default_factory=dict)  # job -> type -> rounds
    owed: dict[int, dict[str, float]] = field(default_factory=dict)  # deficit from old plans
    streak: dict[int, tuple[str, int]] = field(default_factory=dict)  # job -> (type, rounds)

    def new_plan(self, old: Fractions) -> None:
        """Carry each (job, type)'s deficit under the old plan over, then start counting."""
        for job_id, targets in old.items():
            got = self.received.get(job_id, {})
            owed = self.owed.setdefault(job_id, {})
            for gpu_type in set(targets) | set(got):
                owed[gpu_type] = (
                    owed.get(gpu_type, 0.0)
                    + targets.get(gpu_type, 0.0) * self.rounds
                    - got.get(gpu_type, 0)
                )
        self.rounds = 0
        self.received = {}

    def deficit(self, job_id: int, gpu_type: str, target: float) -> float:
        got = self.received.get(job_id, {}).get(gpu_type, 0)
        return self.owed.get(job_id, {}).get(gpu_type, 0.0) + target * self.rounds - got

    def record(self, placed: dict[int, str]) -> None:
        self.rounds += 1
        streak: dict[int, tuple[str, int]] = {}
        for job_id, gpu_type in placed.items():
            kind, run = self.streak.get(job_id, (gpu_type, 0))
            streak[job_id] = (gpu_type, run + 1 if kind == gpu_type else 1)
        self.streak = streak
        for job_id, gpu_type in placed.items():
            per_type = self.received.setdefault(job_id, {})
            per_type[gpu_type] = per_type.get(gpu_type, 0) + 1

    def forget(self, job_id: int) -> None:
        self.received.pop(job_id, None)
        self.owed.pop(job_id, None)
        self.streak.pop(job_id, None)


def lease_rounds(restart_seconds: float, round_seconds: float) -> int:
    """Rounds a gang keeps its GPUs once started: the fewest for which a restart costs at
    most ``LEASE_OVERHEAD`` of the run (1, no lease, without a restart cost)."""
    if restart_seconds <= 0:
        return 1
    return math.ceil(restart_seconds / (LEASE_OVERHEAD * round_seconds))


def place_gangs(
    jobs: list[Job],
    fractions: Fractions,
    tiers: Tiers,
    ledger: Ledger,
    *,
    running: Mapping[int, str] | None = None,
    restart_share: float = 0.0,
    lease: int = 1,
    remaining: Mapping[int, float] | None = None,
    round_seconds: float = 0.0,
) -> dict[int, str]:
    """The GPU type each placed job's whole gang runs on this round (see the module doc).

    ``running``: job id -> the type its gang ran on last round; ``restart_share``: the restart
    cost as a share of a round (0 = none: ``running`` is then ignored); ``lease``: rounds a
    gang keeps its type once started while the plan gives it a share there (1 = none);
    ``remaining``: job id -> steps left, with ``round_seconds``, for a gang whose lease is
    over but whose work ends too soon for a later restart to cost at most 1 % of its run."""
    running = running if restart_share > 0 else {}
    entries: list[tuple[float, float, float, float, int, str]] = []
    for job in jobs:
        for gpu_type, target in fractions.get(job.id, {}).items():
            if target <= 0 or job.throughput.get(gpu_type, 0) <= 0:
                continue
            got = ledger.received.get(job.id, {}).get(gpu_type, 0)
            if restart_share > 0:
                # A job not yet run under this plan is not put first: that would move every
                # gang with a share at each new plan. What it is owed from earlier plans, or
                # has had beyond them, counts: a lease can outlast a plan, and the shares must
                # hold across plans. An incumbent's claim is worth the restart it saves, as a
                # standing order's restart value in the clearing.
                owed = ledger.owed.get(job.id, {}).get(gpu_type, 0.0)
                priority = max(target * (ledger.rounds + 1) + owed, 0.0) / (got + 0.5)
                if running.get(job.id) == gpu_type:
                    priority *= 1 + restart_share
            else:
                priority = target * ledger.rounds / got if got else target * FIRST_TIME
            deficit = ledger.deficit(job.id, gpu_type, target)
            entries.append((-priority, -deficit, -target, job.arrival, job.id, gpu_type))
    entries.sort()
    by_id = {job.id: job for job in jobs}
    free = dict(tiers)
    placed: dict[int, str] = {}
    for job in jobs if lease > 1 else []:  # gangs within their lease keep their GPUs
        gpu_type, run = ledger.streak.get(job.id, ("", 0))
        if (
            0 < run
            and (
                run < lease
                or _runs_to_its_end(
                    job,
                    gpu_type,
                    ledger=ledger,
                    target=fractions.get(job.id, {}).get(gpu_type, 0),
                    remaining=remaining,
                    round_seconds=round_seconds,
                    restart_share=restart_share,
                    lease=lease,
                )
            )
            and fractions.get(job.id, {}).get(gpu_type, 0) > 0
            and free[gpu_type] >= job.scale
        ):
            placed[job.id] = gpu_type
            free[gpu_type] -= job.scale
    for *_, job_id, gpu_type in entries:
        scale = by_id[job_id].scale
        if job_id not in placed and free[gpu_type] >= scale:
            placed[job_id] = gpu_type
            free[gpu_type] -= scale
    for job in jobs:  # a gang that ran last round first, where it ran
        gpu_type = running.get(job.id)
        if job.id not in placed and gpu_type is not None and free[gpu_type] >= job.scale:
            placed[job.id] = gpu_type
            free[gpu_type] -= job.scale
    for job in jobs:  # already in arrival order: oldest first
        if job.id in placed or all(n < job.scale for n in free.values()):
            continue
        for gpu_type in sorted(tiers, key=lambda t: (-job.throughput[t], t)):
            if job.throughput[gpu_type] > 0 and free[gpu_type] >= job.scale:
                placed[job.id] = gpu_type
                free[gpu_type] -= job.scale
                break
    return placed


def _runs_to_its_end(
    job: Job,
    gpu_type: str,
    *,
    ledger: Ledger,
    target: float,
    remaining: Mapping[int, float] | None,
    round_seconds: float,
    restart_share: float,
    lease: int,
) -> bool:
    """Whether a gang whose lease is over keeps its type to its end: its work there ends
    too soon for a restart to cost at most ``LEASE_OVERHEAD`` of the run it would start
    (stopping it would only buy a dearer restart later), and running on leaves it at most
    a lease ahead of its planned share there (the bound a lease itself keeps)."""
    if remaining is None or round_seconds <= 0:
        return False
    seconds_left = remaining[job.id] / job.throughput[gpu_type]
    rounds_left = seconds_left / round_seconds
    return (
        seconds_left * LEASE_OVERHEAD < restart_share * round_seconds
        and rounds_left - ledger.deficit(job.id, gpu_type, target) <= lease
    )


def fluid_gpus(jobs: list[Job], fractions: Fractions, tiers: Tiers) -> dict[int, dict[str, float]]:
    """GPUs of each type each job holds in the fluid model: X x gang size.

    A solver's answer can overshoot a type by rounding dust; such a type is scaled back to
    its capacity so that no round ever uses more GPUs than exist.
    """
    gpus = {
        job.id: {t: x * job.scale for t, x in fractions.get(job.id, {}).items() if x > 0}
        for job in jobs
    }
    for gpu_type, capacity in tiers.items():
        used = sum(g.get(gpu_type, 0.0) for g in gpus.values())
        if used > capacity:
            for g in gpus.values():
                if gpu_type in g:
                    g[gpu_type] *= capacity / used
    return gpus
