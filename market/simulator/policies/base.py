"""What every policy sees and returns.

A policy, ours or a baseline, answers one question: given the jobs now in the system, what
share of each GPU type should each job receive? Its answer is a ``Plan`` of *time fractions*
X[job][type]: the fraction of wall-clock time the job's whole gang should run on that type.
A plan is feasible when, for every job, its fractions sum to at most 1 (a gang runs in one
place at a time) and, for every type, the jobs' fractions times their gang sizes sum to at
most the type's GPUs. The engine then realises the plan round by round (``realise.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from market.simulator.trace import Job

Tiers = dict[str, int]  # GPU type -> GPUs offered
Fractions = dict[int, dict[str, float]]  # job id -> {GPU type: time fraction}

# Limit price per GPU-hour of a job on its slowest GPU type, milli-credits; faster types are
# worth proportionally more (a job values a GPU type by its throughput on it).
BASE_PRICE = 1000


@dataclass(frozen=True)
class View:
    """The state a policy decides on, at the start of a round."""

    now: float  # seconds since the start of the trace
    jobs: tuple[Job, ...]  # in the system, in arrival order
    tiers: Tiers
    remaining: Mapping[int, float]  # job id -> steps still to run
    running: Mapping[int, str]  # job id -> GPU type its gang ran on last round (gangs only)
    usage: Mapping[int, float]  # tenant -> decayed GPU-seconds used (fair-share)
    weights: tuple[int, ...]  # tenant -> entitlement weight
    round_seconds: float
    restart_seconds: int = 0  # progress a preempted gang loses when it next runs
    reserve: Mapping[str, int] = field(default_factory=dict)  # milli-credits per GPU-hour
    max_share_pct: Mapping[str, int] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    fractions: Fractions
    prices: dict[str, float]  # milli-credits per GPU-hour; a job pays min(price, its limit)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicySpec:
    """A named policy and when the engine asks it again.

    ``every_round`` policies depend on more than the set of jobs (a queue's running gangs,
    decayed usage) and are asked each round; the others are asked again only when a job
    arrives or finishes, as Gavel recomputes its allocation, and their plan is realised over
    the rounds in between.
    """

    name: str
    make: Callable[[], Callable[[View], Plan]]  # a fresh (possibly stateful) planner per run
    every_round: bool = False
    market: bool = False  # one of the platform's own mechanisms (cleared by market.clearing)


def limit_prices(job: Job, tiers: Tiers) -> dict[str, int]:
    """The job's limit per GPU-hour on each type, milli-credits: ``BASE_PRICE`` x speed-up."""
    slowest = min(job.throughput[t] for t in tiers)
    return {t: max(1, round(BASE_PRICE * job.throughput[t] / slowest)) for t in tiers}


def equal_share_fractions(job: Job, tiers: Tiers, n: float) -> dict[str, float]:
    """Time fractions of ``job`` alone on 1/n of every type, its gang on the fastest first.

    1/n of type t is C_t/n GPUs, i.e. a time fraction C_t/(n s) for a gang of s GPUs. A gang
    runs in one place at a time, so the fractions are taken fastest type first until they
    sum to 1. (Gavel's isolated allocation spreads the same share over the types in
    proportion to their size instead; both agree whenever the share is below one gang.)
    """
    left = 1.0
    fractions: dict[str, float] = {}
    for gpu_type in sorted(tiers, key=lambda t: (-job.throughput[t], t)):
        take = min(left, tiers[gpu_type] / (n * job.scale))
        if take > 0:
            fractions[gpu_type] = take
            left -= take
        if left <= 1e-12:
            break
    return fractions


def equal_share_rate(job: Job, tiers: Tiers, n: float) -> float:
    """Steps/s of ``job`` alone on 1/n of every type (see ``equal_share_fractions``)."""
    return sum(job.throughput[t] * x for t, x in equal_share_fractions(job, tiers, n).items())


def reserve_prices(view: View) -> dict[str, float]:
    return {t: float(view.reserve.get(t, 0)) for t in view.tiers}
