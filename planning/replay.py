"""Replay forecast demand through the market's own clearing, round by round.

Each replayed round turns the demand of every tier into bids, one per tenant and tier: the
history part of the demand is split over the tenants in the shares they bid in the recent
rounds, each declared campaign's part goes to its own tenant. A tenant's limit price on a tier
is the one it typically bid there (the service passes the median of its recent limits); a
high-priority campaign bids half as much again, a low-priority one three quarters. Bids are
divisible (min 0): the replay asks what capacity does to prices and unmet demand, not how
gangs pack. Fractional GPUs are carried to the tenant's next round so no demand is lost to
rounding. The round is then cleared by ``market.clearing.clear`` with the active policy's
mechanism and priced by the same rounding the market uses (``tier_price``).

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

from market import clearing
from market.services.round_clearing import tier_price
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


def round_reserved_quotas(
    reserved_quotas: Mapping[str, Mapping[str, float]] | str | None,
    *,
    tenants: set[str],
    tiers: set[str],
) -> Mapping[str, Mapping[str, float]] | str:
    """The policy's reserved quotas for one replayed round: "by_weight" as is, a table kept to
    the round's bidding tenants and the scenario's tiers (the clearing refuses names it does
    not hold)."""
    if not reserved_quotas:
        return {}
    if isinstance(reserved_quotas, str):
        return reserved_quotas
    return {
        tenant: {tier: gpus for tier, gpus in row.items() if tier in tiers}
        for tenant, row in reserved_quotas.items()
        if tenant in tenants and isinstance(row, Mapping)
    }


def _round_bids(
    r: int,
    *,
    tiers: Sequence[ReplayTier],
    demand: Mapping[str, TierDemand],
    bidders: Mapping[str, Bidders],
    priorities: Mapping[tuple[str, str], int],
    carry: dict[tuple[str, str], float],
) -> tuple[list[clearing.Bid], dict[str, float]]:
    """Round ``r``'s bids (one per tenant and tier, whole GPUs, fractions carried) and the
    GPUs asked for per tier."""
    bids: list[clearing.Bid] = []
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
            bids.append(
                clearing.Bid(
                    id=f"{tier.slug}:{tenant}",
                    tenant=tenant,
                    quantity=whole,
                    limits={tier.slug: price},
                )
            )
    return bids, asked


def replay(
    *,
    tiers: Sequence[ReplayTier],
    demand: Mapping[str, TierDemand],
    bidders: Mapping[str, Bidders],
    priorities: Mapping[tuple[str, str], int] | None = None,
    mechanism: str = "welfare",
    params: Mapping | None = None,
    reserved_quotas: Mapping[str, Mapping[str, float]] | str | None = None,
    round_hours: float,
    stride: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Clear every ``stride``-th future round of ``demand`` with ``tiers``.

    ``priorities`` maps (tenant, tier) to the highest priority of that tenant's campaigns on
    the tier; ``reserved_quotas`` is the policy's parameter of that name. Raises clearing.ClearingError
    if the solver does."""
    horizon = min(len(d.starts_at) for d in demand.values()) if demand else 0
    indices = list(range(0, horizon, max(1, stride)))
    result = ReplayResult(
        rounds=indices,
        tiers={t.slug: [] for t in tiers},
        weight=max(1, stride),
        round_hours=round_hours,
    )
    carry: dict[tuple[str, str], float] = defaultdict(float)
    spend: dict[str, float] = defaultdict(float)
    solver_tiers = tuple(
        clearing.Tier(
            name=t.slug,
            capacity=t.capacity,
            reserve_price=t.reserve,
            max_share=max(t.max_share_pct, 1) / 100,
        )
        for t in tiers
    )
    reserves = {t.slug: t.reserve for t in tiers}
    for done, r in enumerate(indices, start=1):
        bids, asked = _round_bids(
            r, tiers=tiers, demand=demand, bidders=bidders, priorities=priorities or {},
            carry=carry,
        )  # fmt: skip
        allocated: dict[str, int] = defaultdict(int)
        prices = dict(reserves)
        if bids:
            tenants = {b.tenant for b in bids}
            instance = clearing.Instance(
                tiers=solver_tiers,
                tenants=tuple(clearing.Tenant(name=t) for t in sorted(tenants)),
                bids=tuple(bids),
                reserved_quotas=round_reserved_quotas(
                    reserved_quotas, tenants=tenants, tiers=set(reserves)
                ),
            )
            cleared = clearing.clear(instance, mechanism=mechanism, params=params or None)
            prices = {
                slug: tier_price(float(cleared.prices.get(slug, 0.0)), reserve=reserves[slug])
                for slug in reserves
            }
            limit_of = {b.id: next(iter(b.limits.values())) for b in bids}
            tenant_of = {b.id: b.tenant for b in bids}
            for a in cleared.allocations:
                gpus = int(round(a.gpus))
                allocated[a.tier] += gpus
                paid = min(prices[a.tier], int(limit_of[a.bid]))
                spend[tenant_of[a.bid]] += gpus * paid * round_hours * result.weight
        for tier in tiers:
            result.tiers[tier.slug].append(
                TierRound(
                    demand=asked[tier.slug],
                    capacity=tier.capacity,
                    allocated=allocated[tier.slug],
                    price=prices[tier.slug],
                )
            )
        if progress is not None:
            progress(done, len(indices))
    result.spend = {tenant: int(round(amount)) for tenant, amount in sorted(spend.items())}
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
