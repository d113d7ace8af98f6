"""Reads for the policy pages: versions, the shadow comparison, and replays of past rounds.

A replay clears the recorded bids of past rounds again under a candidate version with the
same code the market clears with (``market.services.round_clearing.solve``), against the
capacity each round actually offered, and sets the outcome beside what really happened.
Nothing is written.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

import numpy as np

from market import clearing
from market.models import Allocation, Bid, BidLimit, PolicyVersion, Round
from market.services.bids import window_seconds
from market.services.round_clearing import RoundData, solve
from tenants.models import Tenant

REPLAYABLE = (Round.Status.SETTLED, Round.Status.FINISHED, Round.Status.VOIDED)


def versions_list() -> list[PolicyVersion]:
    return list(PolicyVersion.objects.select_related("parent", "created_by").order_by("-number"))


def _mean(values: list[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return mean(present) if present else None


@dataclass(frozen=True)
class Side:
    """One policy's outcome for one round."""

    policy: int | None  # version number
    prices: dict[str, int]
    allocated: dict[str, int]
    gpus_by_tenant: dict[str, int]
    revenue: int
    utilisation: float | None
    fairness: float | None
    error: str = ""


@dataclass(frozen=True)
class ComparisonRow:
    round: Round
    active: Side
    other: Side


@dataclass
class ComparisonTotals:
    rounds: int = 0
    revenue_active: int = 0
    revenue_other: int = 0
    gpus_active: int = 0
    gpus_other: int = 0
    utilisation_active: float | None = None
    utilisation_other: float | None = None
    fairness_active: float | None = None
    fairness_other: float | None = None
    tenants: list[tuple[str, int, int]] = field(default_factory=list)  # (name, active, other)
    errors: int = 0


def _totals(rows: list[ComparisonRow]) -> ComparisonTotals:
    totals = ComparisonTotals(rounds=len(rows))
    per_tenant: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        totals.revenue_active += row.active.revenue
        totals.revenue_other += row.other.revenue
        totals.gpus_active += sum(row.active.allocated.values())
        totals.gpus_other += sum(row.other.allocated.values())
        totals.errors += bool(row.other.error)
        for tenant, gpus in row.active.gpus_by_tenant.items():
            per_tenant[tenant][0] += gpus
        for tenant, gpus in row.other.gpus_by_tenant.items():
            per_tenant[tenant][1] += gpus
    totals.utilisation_active = _mean([r.active.utilisation for r in rows])
    totals.utilisation_other = _mean([r.other.utilisation for r in rows])
    totals.fairness_active = _mean([r.active.fairness for r in rows])
    totals.fairness_other = _mean([r.other.fairness for r in rows])
    names = dict(
        Tenant.objects.filter(pk__in=[int(k) for k in per_tenant]).values_list("pk", "name")
    )
    totals.tenants = sorted(
        (names.get(int(k), f"tenant {k}"), a, o) for k, (a, o) in per_tenant.items()
    )
    return totals


def _utilisation(allocated: dict[str, int], capacities: dict[str, Any]) -> float | None:
    """GPUs allocated / GPUs offered, over every tier of the round (None if nothing offered).

    Computed here from the allocations rather than read from the solver's diagnostics, so the
    recorded, shadow and replayed sides are measured the same way.
    """
    offered = sum(int(v) for v in (capacities or {}).values())
    return sum(allocated.values()) / offered if offered else None


def _fairness(diagnostics: dict[str, Any]) -> float | None:
    value = diagnostics.get("jain", diagnostics.get("jain_index"))
    return float(value) if isinstance(value, int | float) else None


def _recorded_side(rnd: Round) -> Side:
    """What the active version actually did in ``rnd`` (its allocations and diagnostics)."""
    allocated: dict[str, int] = defaultdict(int)
    by_tenant: dict[str, int] = defaultdict(int)
    revenue = 0
    for slug, tenant_id, gpus, charge in Allocation.objects.filter(round=rnd).values_list(
        "tier__slug", "tenant_id", "gpus", "charge"
    ):
        allocated[slug] += gpus
        by_tenant[str(tenant_id)] += gpus
        revenue += charge
    diagnostics = rnd.diagnostics or {}
    return Side(
        policy=rnd.policy.number,
        prices={k: int(v) for k, v in (rnd.prices or {}).items()},
        allocated=dict(allocated),
        gpus_by_tenant=dict(by_tenant),
        revenue=revenue,
        utilisation=_utilisation(allocated, rnd.capacities),
        fairness=_fairness(diagnostics),
    )


def _shadow_side(rnd: Round, result: dict[str, Any]) -> Side:
    allocated = {k: int(v) for k, v in (result.get("allocated") or {}).items()}
    diagnostics = result.get("diagnostics") or {}
    fairness = result.get("fairness")
    return Side(
        policy=result.get("number"),
        prices={k: int(v) for k, v in (result.get("prices") or {}).items()},
        allocated=allocated,
        gpus_by_tenant={k: int(v) for k, v in (result.get("gpus_by_tenant") or {}).items()},
        revenue=int(result.get("revenue") or 0),
        utilisation=_utilisation(allocated, rnd.capacities),
        fairness=float(fairness) if isinstance(fairness, int | float) else _fairness(diagnostics),
        error=str(result.get("error") or ""),
    )


def shadow_comparison(*, last: int = 48) -> tuple[list[ComparisonRow], ComparisonTotals]:
    """The last ``last`` settled rounds that were also cleared by a shadow version."""
    rounds = list(
        Round.objects.filter(status__in=REPLAYABLE, shadow_result__isnull=False)
        .select_related("policy", "shadow_policy")
        .order_by("-starts_at")[:last]
    )
    rows = [
        ComparisonRow(round=r, active=_recorded_side(r), other=_shadow_side(r, r.shadow_result))
        for r in rounds
    ]
    return rows, _totals(rows)


def recorded_round_data(rnd: Round) -> RoundData:
    """A past round's inputs as the solver saw them: every bid that was open when it cleared
    (not the ones cancelled before), and the capacity the round offered then."""
    slugs = sorted(rnd.capacities or {})
    capacity = np.array([int(rnd.capacities[s]) for s in slugs], dtype=np.int64)
    rows = np.array(
        Bid.objects.filter(round=rnd)
        .exclude(status=Bid.Status.CANCELLED)
        .order_by("pk")
        .values_list("pk", "tenant_id", "quantity", "min_quantity"),
        dtype=np.int64,
    ).reshape(-1, 4)
    limits = np.zeros((rows.shape[0], len(slugs)), dtype=np.int64)
    column = {s: i for i, s in enumerate(slugs)}
    position = {int(b): i for i, b in enumerate(rows[:, 0])}
    for bid_id, slug, price in BidLimit.objects.filter(bid_id__in=list(position)).values_list(
        "bid_id", "tier__slug", "price"
    ):
        if slug in column:
            limits[position[bid_id], column[slug]] = price
    weights = dict(
        Tenant.objects.filter(pk__in=np.unique(rows[:, 1]).tolist()).values_list("pk", "weight")
    )
    return RoundData(
        bid_ids=rows[:, 0],
        tenant_ids=rows[:, 1],
        quantity=rows[:, 2],
        min_quantity=rows[:, 3],
        escrow=np.zeros(rows.shape[0], dtype=np.int64),
        limits=limits,
        tier_slugs=slugs,
        capacity=capacity,
        tenant_weights=weights,
        seconds=window_seconds(rnd),
    )


def _replayed_side(rnd: Round, version: PolicyVersion) -> Side:
    data = recorded_round_data(rnd)
    try:
        outcome = solve(data=data, policy=version)
    except clearing.ClearingError as exc:
        return Side(version.number, {}, {}, {}, 0, None, None, error=str(exc))
    gpus = outcome.gpus
    allocated = {
        s: int(gpus[:, i].sum()) if gpus.size else 0 for i, s in enumerate(data.tier_slugs)
    }
    by_tenant: dict[str, int] = defaultdict(int)
    if gpus.size:
        for tenant_id, total in zip(
            data.tenant_ids.tolist(), gpus.sum(axis=1).tolist(), strict=True
        ):
            if total:
                by_tenant[str(tenant_id)] += int(total)
    diagnostics = outcome.diagnostics or {}
    return Side(
        policy=version.number,
        prices=dict(outcome.prices),
        allocated=allocated,
        gpus_by_tenant=dict(by_tenant),
        revenue=outcome.revenue(data) if gpus.size else 0,
        utilisation=_utilisation(allocated, rnd.capacities),
        fairness=_fairness(diagnostics),
    )


def rounds_replay(
    *, version: PolicyVersion, last: int
) -> tuple[list[ComparisonRow], ComparisonTotals]:
    """Clear the last ``last`` settled rounds again under ``version`` (nothing is written)."""
    rounds = list(
        Round.objects.filter(status__in=REPLAYABLE)
        .exclude(capacities={})
        .select_related("policy")
        .order_by("-starts_at")[:last]
    )
    rows = [
        ComparisonRow(round=r, active=_recorded_side(r), other=_replayed_side(r, version))
        for r in rounds
    ]
    return rows, _totals(rows)
