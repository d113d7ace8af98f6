"""Replaying past rounds under a candidate version: the recorded bids of each round are
cleared again with the same code the market clears with (``market.services.round_clearing.solve``),
against the capacity the round actually offered, and the outcome is set beside what really
happened. It runs the solver, so it is a service (called by the replay page and the
``simulate --replay`` command); nothing is written.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from market import clearing
from market.diagnostics import jain_counting_left_out
from market.models import Bid, BidLimit, PolicyVersion, Round
from market.policy.selectors import (
    REPLAYABLE,
    ComparisonRow,
    ComparisonTotals,
    Side,
    comparison_totals,
    recorded_side,
    side_fairness,
    side_utilisation,
)
from market.services.bids import window_seconds
from market.services.round_clearing import RoundData, solve
from tenants.models import Tenant, Transfer


def recorded_round_data(rnd: Round) -> RoundData:
    """A past round's inputs as the solver saw them: the bids it cleared (not the ones
    cancelled before it cleared, nor the ones it left out over a hard cap or because no node
    could hold their gang), the escrow each held then, and the capacity the round offered."""
    slugs = sorted(rnd.capacities or {})
    capacity = np.array([int(rnd.capacities[s]) for s in slugs], dtype=np.int64)
    diagnostics = rnd.diagnostics or {}
    left_out = {
        int(pk)
        for key in ("left_out_by_hard_cap", "left_out_by_placement")
        for pk in diagnostics.get(key) or {}
    }
    rows = np.array(
        Bid.objects.filter(round=rnd)
        .exclude(status=Bid.Status.CANCELLED)
        .exclude(pk__in=left_out)
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
        escrow=_escrow_when_cleared(rows[:, 0]),
        limits=limits,
        tier_slugs=slugs,
        capacity=capacity,
        tenant_weights=weights,
        seconds=window_seconds(rnd),
    )


def _escrow_when_cleared(bid_ids: np.ndarray) -> np.ndarray:
    """What each bid held in escrow when its round cleared, from the ledger: its holds less
    the releases of edits that lowered it (settlement's and a cancel's releases came after).
    The Fisher market's budgets are this escrow, so without it a replay is another market."""
    held = dict.fromkeys(bid_ids.tolist(), 0)
    references = {f"bid:{pk}": pk for pk in held}
    for reference, kind, amount in (
        Transfer.objects.filter(
            reference__in=list(references), kind__in=[Transfer.Kind.HOLD, Transfer.Kind.RELEASE]
        )
        .exclude(ledgeroperation__key__startswith="settle:")
        .exclude(ledgeroperation__key__startswith="cancel:")
        .values_list("reference", "kind", "amount")
    ):
        held[references[reference]] += amount if kind == Transfer.Kind.HOLD else -amount
    return np.array([max(held[pk], 0) for pk in bid_ids.tolist()], dtype=np.int64)


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
    # Counted over the same teams as the round's own figure: those it left out at nothing.
    diagnostics = outcome.diagnostics or {}
    diagnostics = diagnostics | jain_counting_left_out(
        diagnostics,
        cleared_teams=int(np.unique(data.tenant_ids).size),
        left_out_teams=int((rnd.diagnostics or {}).get("teams_left_out") or 0),
    )
    return Side(
        policy=version.number,
        prices=dict(outcome.prices),
        allocated=allocated,
        gpus_by_tenant=dict(by_tenant),
        revenue=outcome.revenue(data) if gpus.size else 0,
        utilisation=side_utilisation(allocated, rnd.capacities),
        fairness=side_fairness(diagnostics),
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
        ComparisonRow(round=r, active=recorded_side(r), other=_replayed_side(r, version))
        for r in rounds
    ]
    return rows, comparison_totals(rows)
