"""Replaying past rounds under a candidate version: the recorded bids of each round are
cleared again by the market's one replay (``market.services.round_clearing.round_replay``),
against the capacity the round actually offered, and the outcome is set beside what really
happened. It runs the solver, so it is a service (called by the replay page and the
``simulate --replay`` command); nothing is written.
"""

from __future__ import annotations

import numpy as np

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
from market.services.round_clearing import RoundData, round_replay
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
    replayed = round_replay(
        data=recorded_round_data(rnd),
        policy=version,
        left_out_teams=int((rnd.diagnostics or {}).get("teams_left_out") or 0),
    )
    if "error" in replayed:
        return Side(version.number, {}, {}, {}, 0, None, None, error=replayed["error"])
    return Side(
        policy=version.number,
        prices=dict(replayed["prices"]),
        allocated=dict(replayed["allocated"]),
        gpus_by_tenant={t: n for t, n in replayed["gpus_by_tenant"].items() if n},
        revenue=int(replayed["revenue"]),
        utilisation=side_utilisation(replayed["allocated"], rnd.capacities),
        fairness=side_fairness(replayed["diagnostics"]),
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
