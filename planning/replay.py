"""Replay forecast demand through the market's own clearing, round by round.

Each replayed round turns the demand of every tier into bids, one per tenant and tier: the
history part of the demand is split over the tenants in the shares they bid in the recent
rounds, each declared campaign's part goes to its own tenant. A tenant's limit price on a tier
is the one it typically bid there (the service passes the median of its recent limits); a
high-priority campaign bids half as much again, a low-priority one three quarters. Bids are
divisible (min 0): the replay asks what capacity does to prices and unmet demand, not how
gangs pack. Fractional GPUs are carried to the tenant's next round so no demand is lost to
rounding. Each bid holds the escrow a bid placed by hand would (its GPUs at its limit for the
round), each tenant bids with its own weight, and the round is cleared by the market's one
replay of a clearing, ``market.services.round_clearing.round_replay``, under the active
policy with the scenario's reserves and share caps: the same instance, solver, reserved
quotas, checks and price rounding as a real round and its shadow.

Expected wait for a job of ``job_gpus`` GPUs on a tier, in rounds: with demand D and capacity
C in a round, a waiting job is served in a round with probability p = min(1, C / D) (the share
of demand the tier can serve), so it waits (1 - p) / p rounds on average (a geometric
number of tries); a job larger than the tier never starts (None).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from core.money import cost_ceil, cost_floor
from market.clearing import ClearingError
from market.models import PolicyVersion
from market.services.round_clearing import RoundData, round_replay
from planning.demand import TierDemand

PRIORITY_PRICE = {1: 0.75, 2: 1.0, 3: 1.5}


@dataclass(frozen=True)
class ReplayTier:
    """A tier as the scenario has it: capacity in GPUs, reserve in milli-credits/GPU-hour."""

    slug: str
    capacity: int
    reserve: int
    max_share_pct: int = 100


@dataclass(frozen=True)
class Bidders:
    """Who bids on a tier and how: ``shares`` of the history demand per tenant (summing to
    1), ``limits`` per tenant in milli-credits per GPU-hour, ``default_limit`` for a tenant
    with no recent limit there (a campaign's team new to the tier)."""

    shares: Mapping[str, float]
    limits: Mapping[str, int]
    default_limit: int


@dataclass(frozen=True)
class Team:
    """A bidding tenant as the clearing knows it: its id and entitlement weight."""

    pk: int
    weight: int


@dataclass
class TierRound:
    demand: float
    capacity: int
    allocated: int
    price: int  # milli-credits per GPU-hour


@dataclass
class ReplayResult:
    """Per replayed round (index into the demand's rounds) and tier; spend per tenant in
    milli-credits, each replayed round counted ``weight`` times."""

    rounds: list[int] = field(default_factory=list)
    tiers: dict[str, list[TierRound]] = field(default_factory=dict)
    spend: dict[str, int] = field(default_factory=dict)
    weight: int = 1
    round_hours: float = 1.0


def wait_rounds(*, demand: float, capacity: int, job_gpus: int) -> float | None:
    """Expected rounds a job of ``job_gpus`` waits (see the module docstring)."""
    if job_gpus > capacity:
        return None
    if demand <= capacity:
        return 0.0
    p = capacity / demand
    return (1 - p) / p


def _limit(bidders: Bidders, tenant: str, priority: int = 2) -> int:
    base = bidders.limits.get(tenant, bidders.default_limit)
    return max(1, int(base * PRIORITY_PRICE.get(priority, 1.0)))


@dataclass(frozen=True)
class _Ask:
    """One replayed bid: whole GPUs a tenant asks for on a tier at its limit."""

    tenant: str
    tier: str
    gpus: int
    limit: int  # milli-credits per GPU-hour


def _round_asks(
    r: int,
    *,
    tiers: Sequence[ReplayTier],
    demand: Mapping[str, TierDemand],
    bidders: Mapping[str, Bidders],
    priorities: Mapping[tuple[str, str], int],
    carry: dict[tuple[str, str], float],
) -> tuple[list[_Ask], dict[str, float]]:
    """Round ``r``'s bids (one per tenant and tier, whole GPUs, fractions carried) and the
    GPUs asked for per tier."""
    asks: list[_Ask] = []
    asked: dict[str, float] = {}
    for tier in tiers:
        want: dict[str, float] = defaultdict(float)
        d = demand.get(tier.slug)
        if d is not None:
            for tenant, share in bidders[tier.slug].shares.items():
                want[tenant] += d.history[r] * share
            for tenant, gpus in d.campaigns[r].items():
                want[tenant] += gpus
        asked[tier.slug] = sum(want.values())
        for tenant, gpus in sorted(want.items()):
            total = gpus + carry[(tenant, tier.slug)]
            whole = math.floor(total)
            carry[(tenant, tier.slug)] = total - whole
            if whole < 1:
                continue
            price = _limit(bidders[tier.slug], tenant, priorities.get((tenant, tier.slug), 2))
            asks.append(_Ask(tenant=tenant, tier=tier.slug, gpus=whole, limit=price))
    return asks, asked


def _round_data(
    asks: Sequence[_Ask], *, tiers: Sequence[ReplayTier], teams: Mapping[str, Team], seconds: int
) -> RoundData:
    """The replayed round as the market reads one (``round_data``): the asks as divisible
    bids, each holding the escrow a bid placed by hand would hold."""
    slugs = [t.slug for t in tiers]
    limits = np.zeros((len(asks), len(slugs)), dtype=np.int64)
    limits[np.arange(len(asks)), [slugs.index(a.tier) for a in asks]] = [a.limit for a in asks]
    return RoundData(
        bid_ids=np.arange(1, len(asks) + 1, dtype=np.int64),
        tenant_ids=np.array([teams[a.tenant].pk for a in asks], dtype=np.int64),
        quantity=np.array([a.gpus for a in asks], dtype=np.int64),
        min_quantity=np.zeros(len(asks), dtype=np.int64),
        escrow=np.array(
            [cost_ceil(gpus=a.gpus, price=a.limit, seconds=seconds) for a in asks], dtype=np.int64
        ),
        limits=limits,
        tier_slugs=slugs,
        capacity=np.array([t.capacity for t in tiers], dtype=np.int64),
        tenant_weights={team.pk: team.weight for team in teams.values()},
        seconds=seconds,
    )


def replay_policy(policy: PolicyVersion | None, tiers: Sequence[ReplayTier]) -> PolicyVersion:
    """The policy a replay clears under: the active one's mechanism and parameters (welfare
    without one), with the scenario's reserves and share caps. Not saved."""
    return PolicyVersion(
        number=policy.number if policy else 0,
        mechanism=policy.mechanism if policy else PolicyVersion.Mechanism.WELFARE,
        params=dict(policy.params or {}) if policy else {},
        reserve_prices={t.slug: t.reserve for t in tiers},
        max_share_pct={t.slug: t.max_share_pct for t in tiers},
    )


def _teams(
    teams: Mapping[str, Team] | None,
    bidders: Mapping[str, Bidders],
    demand: Mapping[str, TierDemand],
) -> dict[str, Team]:
    """Every tenant that may bid, with its id and weight; without ``teams`` (no database)
    each gets an id of its own and weight 1."""
    named = set(teams or {})
    named |= {tenant for b in bidders.values() for tenant in b.shares}
    named |= {tenant for d in demand.values() for row in d.campaigns for tenant in row}
    known = dict(teams or {})
    spare = iter(range(max((t.pk for t in known.values()), default=0) + 1, 1 << 62))
    return {name: known.get(name) or Team(pk=next(spare), weight=1) for name in sorted(named)}


def replay(
    *,
    tiers: Sequence[ReplayTier],
    demand: Mapping[str, TierDemand],
    bidders: Mapping[str, Bidders],
    teams: Mapping[str, Team] | None = None,
    priorities: Mapping[tuple[str, str], int] | None = None,
    policy: PolicyVersion | None = None,
    round_hours: float,
    stride: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Clear every ``stride``-th future round of ``demand`` with ``tiers``, each by the
    market's own ``round_replay`` under ``replay_policy(policy, tiers)``.

    ``teams`` maps tenant slugs to their ids and weights; ``priorities`` maps (tenant, tier)
    to the highest priority of that tenant's campaigns on the tier. Raises
    clearing.ClearingError if the solver does."""
    horizon = min(len(d.starts_at) for d in demand.values()) if demand else 0
    indices = list(range(0, horizon, max(1, stride)))
    result = ReplayResult(
        rounds=indices,
        tiers={t.slug: [] for t in tiers},
        weight=max(1, stride),
        round_hours=round_hours,
    )
    cleared_under = replay_policy(policy, tiers)
    everyone = _teams(teams, bidders, demand)
    seconds = int(round(round_hours * 3600))
    carry: dict[tuple[str, str], float] = defaultdict(float)
    spend: dict[str, int] = defaultdict(int)
    for done, r in enumerate(indices, start=1):
        asks, asked = _round_asks(
            r, tiers=tiers, demand=demand, bidders=bidders, priorities=priorities or {},
            carry=carry,
        )  # fmt: skip
        outcome = round_replay(
            data=_round_data(asks, tiers=tiers, teams=everyone, seconds=seconds),
            policy=cleared_under,
        )
        if "error" in outcome:
            raise ClearingError(outcome["error"])
        for bid_id, slug, gpus in outcome["awards"]:
            ask = asks[bid_id - 1]
            paid = min(outcome["prices"][slug], ask.limit)
            charge = cost_floor(gpus=gpus, price=paid, seconds=seconds)
            spend[ask.tenant] += charge * result.weight
        for tier in tiers:
            result.tiers[tier.slug].append(
                TierRound(
                    demand=asked[tier.slug],
                    capacity=tier.capacity,
                    allocated=outcome["allocated"][tier.slug],
                    price=outcome["prices"][tier.slug],
                )
            )
        if progress is not None:
            progress(done, len(indices))
    result.spend = dict(sorted(spend.items()))
    return result


@dataclass(frozen=True)
class TierWeek:
    """One tier over one week of the replay. Price is the demand-weighted mean clearing price
    (milli-credits/GPU-hour); GPU-hours count every round the replayed ones stand for."""

    week: int
    price: int
    demand_gpu_hours: float
    unmet_gpu_hours: float
    utilisation_pct: float
    wait_rounds: float | None


def weekly(
    result: ReplayResult, *, rounds_per_week: int, job_gpus: int
) -> dict[str, list[TierWeek]]:
    """The replay summed per tier and week (week 1 = the first ``rounds_per_week`` rounds)."""
    out: dict[str, list[TierWeek]] = {}
    hours = result.round_hours * result.weight
    for slug, records in result.tiers.items():
        by_week: dict[int, list[TierRound]] = defaultdict(list)
        for index, record in zip(result.rounds, records, strict=True):
            by_week[index // rounds_per_week + 1].append(record)
        weeks = []
        for week, rows in sorted(by_week.items()):
            demand = sum(r.demand for r in rows)
            capacity = sum(r.capacity for r in rows)
            allocated = sum(r.allocated for r in rows)
            weighted = sum(r.price * max(r.demand, 1e-9) for r in rows)
            waits = [
                wait_rounds(demand=r.demand, capacity=r.capacity, job_gpus=job_gpus) for r in rows
            ]
            weeks.append(
                TierWeek(
                    week=week,
                    price=int(round(weighted / sum(max(r.demand, 1e-9) for r in rows))),
                    demand_gpu_hours=demand * hours,
                    unmet_gpu_hours=sum(max(r.demand - r.allocated, 0.0) for r in rows) * hours,
                    utilisation_pct=100 * allocated / capacity if capacity else 0.0,
                    wait_rounds=None if None in waits else sum(waits) / len(waits),
                )
            )
        out[slug] = weeks
    return out
