"""Clearing a round: the solver instance is built from the database (vectorised), solved
under the round's policy (and its shadow policy, for comparison only), and the outcome kept on
the round for settlement. The claim on the round is its row lock; its status says what is done.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from django.db import transaction

import audit.services as audit
from core.money import cost_floor
from core.rows import rows_read
from market import clearing
from market.clearing.instance.inputs import MAX_AMOUNT, Arrays
from market.diagnostics import JAIN, UTILISATION, diagnostic, jain_counting_left_out
from market.errors import MarketError
from market.models import Bid, BidLimit, PolicyVersion, Round, Tier
from market.services._common import now_or, round_locked
from market.services.bids import window_seconds
from market.services.partitioned import clear_in_parts, partition_parts
from market.services.placement import placement_misfits
from market.services.policy import PLATFORM_PARAMS
from market.services.rounds import _close_locked
from market.services.void import round_fail
from tenants.budgets import hard_cap_admit
from tenants.models import Budget, Tenant

logger = logging.getLogger(__name__)
# Clearings of one round at most: each one after the first leaves out the gangs the previous
# one won but placement could not fit on one node.
PLACEMENT_ATTEMPTS = 4

# Fault injection for the crash test (tests/market/test_market_celery.py) and for operators
# rehearsing recovery: when set to a directory, the clearing path writes
# ``<dir>/claimed-<round id>`` right after it has claimed a round under its row lock, then
# waits there (up to CLEARING_HOLD_SECONDS) so the process can be killed mid-clearing at a
# known point. Unset in every real deployment; read at call time, never at import.
CLEARING_HOLD_ENV = "GPUMARKET_TEST_CLEARING_HOLD"
CLEARING_HOLD_SECONDS = 120
# Policy parameter for reserved quotas (Kueue-style nominal quotas), read here, not by the
# mechanism: "by_weight" or {tenant slug: {tier slug: GPUs}}; empty by default.
RESERVED_QUOTAS_PARAM = "reserved_quotas"


def _fault_injection_hold(round_id: int) -> None:
    folder = os.environ.get(CLEARING_HOLD_ENV)
    if not folder:
        return
    marker = Path(folder) / f"claimed-{round_id}"
    marker.write_text(str(os.getpid()))
    logger.warning(
        "%s is set: holding round %s mid-clearing for the crash test", CLEARING_HOLD_ENV, round_id
    )
    # The outage test lets the clearing go on by creating the release file.
    release = Path(folder) / f"release-{round_id}"
    deadline = time.monotonic() + CLEARING_HOLD_SECONDS
    while time.monotonic() < deadline and not release.exists():
        time.sleep(0.1)


@dataclass(frozen=True)
class RoundData:
    """The round's open bids and offered tiers as arrays (row = bid, column = tier), in the
    platform's ids and units; ``_arrays`` makes the solver's ``Arrays`` of it."""

    bid_ids: np.ndarray  # (n_bids,) int64
    tenant_ids: np.ndarray  # (n_bids,) int64
    quantity: np.ndarray  # (n_bids,) int64, GPUs
    min_quantity: np.ndarray  # (n_bids,) int64, GPUs (0 = divisible)
    escrow: np.ndarray  # (n_bids,) int64, milli-credits
    limits: np.ndarray  # (n_bids, n_tiers) int64, milli-credits per GPU-hour; 0 = not acceptable
    tier_slugs: list[str]  # (n_tiers,)
    capacity: np.ndarray  # (n_tiers,) int64, GPUs offered (healthy capacity less maintenance)
    tenant_weights: dict[int, int]  # tenant id -> entitlement weight
    seconds: int  # window length


def round_data(rnd: Round, *, left_out: frozenset[int] = frozenset()) -> RoundData:
    """Read a round's inputs with four queries and no Python object per bid; the bids in
    ``left_out`` (over a hard cap) are not part of it."""
    tiers = list(
        Tier.objects.filter(active=True)
        .order_by("pk")
        .values_list("pk", "slug", "capacity", "maintenance_gpus")
    )
    tier_pks = np.array([t[0] for t in tiers], dtype=np.int64)
    capacity = np.array([max(t[2] - t[3], 0) for t in tiers], dtype=np.int64)
    open_bids = Bid.objects.filter(round=rnd, status=Bid.Status.OPEN).exclude(pk__in=left_out)
    rows = rows_read(
        open_bids.order_by("pk").values_list(
            "pk", "tenant_id", "quantity", "min_quantity", "escrow"
        )
    )
    ids = rows[:, 0]
    limits = np.zeros((ids.size, tier_pks.size), dtype=np.int64)
    if ids.size and tier_pks.size:
        # The limits by the range of this round's bid ids, without a join to the bids (a
        # million bids: 1.4 s of the database's time for the join, 0.4 s for the range); a
        # limit whose bid is not one read above (another round's, cancelled, left out) or
        # whose tier is not active is dropped here. Both id columns are sorted, so a binary
        # search maps ids to row and column positions.
        found = rows_read(
            BidLimit.objects.filter(bid__gte=int(ids[0]), bid__lte=int(ids[-1])).values_list(
                "bid_id", "tier_id", "price"
            )
        )
        row = np.minimum(np.searchsorted(ids, found[:, 0]), ids.size - 1)
        col = np.minimum(np.searchsorted(tier_pks, found[:, 1]), tier_pks.size - 1)
        mine = (ids[row] == found[:, 0]) & (tier_pks[col] == found[:, 1])
        limits[row[mine], col[mine]] = found[mine, 2]
    tenant_ids = rows[:, 1]
    # The bidding tenants' weights by the range of their ids, kept where one bids (100k
    # tenants: 0.14-0.20 s; 0.54-0.56 s by a subquery of the bids, 1.17 s by a list of ids).
    bidding = np.unique(tenant_ids)
    weights = {}
    if bidding.size:
        found = rows_read(
            Tenant.objects.filter(pk__gte=int(bidding[0]), pk__lte=int(bidding[-1]))
            .order_by()  # not by name (the model's order): a sort of every tenant for nothing
            .values_list("pk", "weight")
        )
        found = found[np.isin(found[:, 0], bidding)]
        weights = dict(zip(found[:, 0].tolist(), found[:, 1].tolist(), strict=True))
    return RoundData(
        bid_ids=rows[:, 0],
        tenant_ids=tenant_ids,
        quantity=rows[:, 2],
        min_quantity=rows[:, 3],
        escrow=rows[:, 4],
        limits=limits,
        tier_slugs=[t[1] for t in tiers],
        capacity=capacity,
        tenant_weights=weights,
        seconds=window_seconds(rnd),
    )


@dataclass(frozen=True)
class RoundOutcome:
    """A solved round in the platform's units: the solver's ``clearing.Result`` as whole GPUs
    per (bid, tier) of its ``RoundData`` and prices in milli-credits, rounded down."""

    gpus: np.ndarray  # (n_bids, n_tiers) int64, GPUs awarded
    prices: dict[str, int]  # tier slug -> milli-credits per GPU-hour, rounded down
    diagnostics: dict[str, Any]

    def awards(self, data: RoundData) -> list[list[Any]]:
        rows, cols = np.nonzero(self.gpus)
        return [
            [int(data.bid_ids[r]), data.tier_slugs[c], int(self.gpus[r, c])]
            for r, c in zip(rows, cols, strict=True)
        ]

    def revenue(self, data: RoundData) -> int:
        """What settlement would charge: per award gpus x min(price, limit) x hours, rounded down."""
        total = 0
        rows, cols = np.nonzero(self.gpus)
        for r, c in zip(rows, cols, strict=True):
            price = min(self.prices[data.tier_slugs[c]], int(data.limits[r, c]))
            total += cost_floor(gpus=int(self.gpus[r, c]), price=price, seconds=data.seconds)
        return total


def tier_price(raw: float, *, reserve: int) -> int:
    """A solver price (a float from the capacity dual) as integer milli-credits per GPU-hour.

    Rounded DOWN, so the uniform price never rises above the limit of a winner whose limit set
    it; a winner pays min(price, its limit) anyway. A tolerance of 1e-6 keeps solver noise
    (4999.9999999 for 5000) from costing a whole milli-credit, and the price is never below the
    tier's reserve.
    """
    if not math.isfinite(raw):
        raise clearing.ClearingError(f"the solver returned a non-finite price {raw!r}")
    return max(int(math.floor(raw + 1e-6)), reserve)


def solve(*, data: RoundData, policy: PolicyVersion) -> RoundOutcome:
    """Solve one round's instance under ``policy``. Raises clearing.ClearingError."""
    reserves = np.array([policy.reserve_for(slug) for slug in data.tier_slugs], dtype=np.int64)
    if data.bid_ids.size == 0:
        return RoundOutcome(
            gpus=np.zeros((0, len(data.tier_slugs)), dtype=np.int64),
            prices=dict(zip(data.tier_slugs, (int(r) for r in reserves), strict=True)),
            diagnostics={"status": "no bids", "mechanism": policy.mechanism},
        )
    params = {k: v for k, v in (policy.params or {}).items() if k not in PLATFORM_PARAMS}
    reserved_quotas = _reserved_quotas(params.pop(RESERVED_QUOTAS_PARAM, None), data=data)
    start = time.perf_counter()
    arrays = _arrays(data=data, policy=policy, reserves=reserves)
    arrays_seconds = time.perf_counter() - start
    parts = partition_parts(int(data.bid_ids.size), mechanism=policy.mechanism)
    if parts > 1:
        result = clear_in_parts(
            arrays,
            mechanism=policy.mechanism,
            params=params or None,
            reserved_quotas=reserved_quotas,
            parts=parts,
        )
    else:
        result = clearing.clear_arrays(
            arrays,
            mechanism=policy.mechanism,
            params=params or None,
            reserved_quotas=reserved_quotas,
        )
    outcome = _outcome(
        result=result, data=data, arrays=arrays, reserves=reserves, mechanism=policy.mechanism
    )
    # How long the rows took to become the solver's arrays, beside the solver's own times.
    return replace(outcome, diagnostics=outcome.diagnostics | {"arrays_seconds": arrays_seconds})


def _reserved_quotas(setting: object, *, data: RoundData) -> dict | str:
    """The policy's reserved quotas in the solver's names: "by_weight" (each tenant's
    weighted share of every tier it bids on, set aside before the mechanism runs) or
    {tenant slug: {tier slug: GPUs}}; tenants without a bid and retired tiers drop out."""
    if not setting:
        return {}
    if setting == "by_weight":
        return "by_weight"
    if not isinstance(setting, dict):
        raise clearing.ClearingError(
            f'{RESERVED_QUOTAS_PARAM}: must be "by_weight" or {{tenant: {{tier: GPUs}}}}'
        )
    slugs = dict(
        Tenant.objects.filter(pk__in=np.unique(data.tenant_ids).tolist()).values_list("slug", "pk")
    )
    return {
        _tenant_name(slugs[tenant]): {t: g for t, g in row.items() if t in data.tier_slugs}
        for tenant, row in setting.items()
        if tenant in slugs and isinstance(row, dict)
    }


def _bid_name(pk: int) -> str:
    # Zero-padded so the solver's order by id (its deterministic tie-break) is placement order.
    return f"{pk:012d}"


def _tenant_name(pk: int) -> str:
    return f"tenant-{pk}"


def _arrays(*, data: RoundData, policy: PolicyVersion, reserves: np.ndarray) -> Arrays:
    """The solver's instance as arrays, in milli-credits (the solver is unit-free; its prices
    come back in the same unit), built from the round's arrays without an object per bid: the
    same arrays ``instance_arrays`` makes of the instance these rows describe (tenants in name
    order, bids in id order, arcs by (bid, tier) with those below the reserve left out). A
    tenant's budget is the escrow its bids hold, per window hour."""
    hours = data.seconds / 3600
    tenant_ids, tenant_of_bid = np.unique(data.tenant_ids, return_inverse=True)
    budgets = (
        np.bincount(tenant_of_bid, weights=data.escrow.astype(float), minlength=tenant_ids.size)
        / hours
    )
    names = [_tenant_name(pk) for pk in tenant_ids.tolist()]
    by_name = np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)
    rank = np.empty_like(by_name)
    rank[by_name] = np.arange(by_name.size)
    weights = np.array(
        [float(data.tenant_weights.get(pk, 1)) for pk in tenant_ids.tolist()], dtype=float
    )
    arc_bid, arc_tier = np.nonzero(data.limits)  # row-major: in (bid, tier) order
    arc_price = data.limits[arc_bid, arc_tier].astype(float)
    keep = arc_price >= reserves[arc_tier]
    arrays = Arrays(
        tier_names=tuple(data.tier_slugs),
        tenant_names=tuple(names[i] for i in by_name.tolist()),
        bid_ids=tuple(map(_bid_name, data.bid_ids.tolist())),
        capacity=data.capacity.astype(float),
        reserve=reserves.astype(float),
        cap_share=np.array([policy.max_share_for(s) / 100 for s in data.tier_slugs], dtype=float),
        weight=weights[by_name],
        budget=budgets[by_name],
        bid_tenant=rank[tenant_of_bid].astype(np.int64),
        quantity=data.quantity.astype(float),
        min_quantity=data.min_quantity.astype(float),
        mixed_tiers=np.zeros(data.bid_ids.size, dtype=bool),
        arc_bid=arc_bid.astype(np.int64)[keep],
        arc_tier=arc_tier.astype(np.int64)[keep],
        arc_price=arc_price[keep],
    )
    if np.any(arrays.budget > MAX_AMOUNT) or np.any(arrays.arc_price > MAX_AMOUNT):
        raise clearing.ClearingError(
            f"a budget or limit in this round is above the solver's {MAX_AMOUNT:g} milli-credits"
        )
    return arrays


def _outcome(
    *,
    result: clearing.Result,
    data: RoundData,
    arrays: Arrays,
    reserves: np.ndarray,
    mechanism: str,
) -> RoundOutcome:
    """The solver's result in platform units, checked: whole GPUs, only on tiers a bid
    accepted, never above a tier's capacity. A violation is a solver fault and fails the round
    rather than being settled."""
    gpus = np.zeros(data.limits.shape, dtype=np.int64)
    won = result.awards
    if won.bid_ids != arrays.bid_ids or won.tier_names != arrays.tier_names:
        raise clearing.ClearingError(
            "the solver's awards are not in the round's bid and tier order"
        )
    if won.bid.size:
        # The arrays hold the round's bids and tiers in its own order (``_arrays``), so the
        # awards' positions are the rows and columns of ``data``.
        amounts = won.gpus.astype(float)
        whole_gpus = np.rint(amounts)
        if np.any(np.abs(amounts - whole_gpus) > 1e-6) or np.any(whole_gpus < 0):
            raise clearing.ClearingError(
                "the solver returned a fractional or negative number of GPUs"
            )
        np.add.at(gpus, (won.bid, won.tier), whole_gpus.astype(np.int64))
    if np.any((gpus > 0) & (data.limits == 0)):
        raise clearing.ClearingError("the solver awarded a tier a bid did not accept")
    if np.any(gpus.sum(axis=0) > data.capacity) or np.any(gpus.sum(axis=1) > data.quantity):
        raise clearing.ClearingError(
            "the solver awarded more GPUs than a tier has or a bid asked for"
        )
    prices = {
        slug: tier_price(float(result.prices.get(slug, reserves[j])), reserve=int(reserves[j]))
        for j, slug in enumerate(data.tier_slugs)
    }
    return RoundOutcome(
        gpus=gpus,
        prices=prices,
        diagnostics=_jsonable(dict(result.diagnostics)) | {"mechanism": mechanism},
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def _summary(outcome: RoundOutcome, data: RoundData, policy: PolicyVersion) -> dict[str, Any]:
    allocated = (
        outcome.gpus.sum(axis=0)
        if outcome.gpus.size
        else np.zeros(len(data.tier_slugs), dtype=np.int64)
    )
    per_tenant: dict[str, int] = {}
    if outcome.gpus.size:
        totals = outcome.gpus.sum(axis=1)
        for tenant_id in np.unique(data.tenant_ids):
            per_tenant[str(int(tenant_id))] = int(totals[data.tenant_ids == tenant_id].sum())
    return {
        "policy": policy.pk,
        "number": policy.number,
        "mechanism": policy.mechanism,
        "prices": outcome.prices,
        "allocated": {slug: int(allocated[i]) for i, slug in enumerate(data.tier_slugs)},
        "gpus_by_tenant": per_tenant,
        "winners": int(np.count_nonzero(outcome.gpus.sum(axis=1))) if outcome.gpus.size else 0,
        "revenue": outcome.revenue(data),
        "utilisation": diagnostic(outcome.diagnostics, UTILISATION),
        "fairness": diagnostic(outcome.diagnostics, JAIN),
        "awards": outcome.awards(data),
        "diagnostics": outcome.diagnostics,
    }


@transaction.atomic
def round_clear(*, round_id: int, now: datetime | None = None, wait: bool = True) -> Round:
    """Claim a round whose bidding has closed and solve it; the outcome (awards, prices,
    capacities, diagnostics and the shadow comparison) is stored and the round is ``cleared``.

    Single-flight: the round row is locked for the whole clearing, and a round that is no
    longer ``closed`` (already cleared, settled, failed...) is returned untouched. An open round
    whose bidding time is over is closed first, in the same transaction. A solver error fails
    the round (every hold released) with the solver's reason. ``wait=False``: RoundBusy if
    another worker holds the round longer than a moment (``round_locked``).
    """
    now = now_or(now)
    rnd = round_locked(round_id, wait=wait, related=("policy", "shadow_policy"))
    if rnd.status == Round.Status.OPEN:
        if rnd.closes_at > now:
            raise MarketError(
                f"round {rnd.pk} is still open for bids until {rnd.closes_at:%Y-%m-%d %H:%M:%S} UTC"
            )
        _close_locked(rnd, now=now)
    if rnd.status != Round.Status.CLOSED:
        return rnd
    _fault_injection_hold(rnd.pk)
    left_out = _over_hard_caps(rnd, now=now)
    try:
        data, outcome, misplaced = _solve_placeable(rnd, left_out=left_out)
    except _Unclearable as exc:
        return round_fail(round=rnd, reason=str(exc))
    _outcome_store(rnd, data=data, outcome=outcome, left_out=left_out, misplaced=misplaced, now=now)
    _clear_record(rnd, bids=int(data.bid_ids.size))
    return rnd


class _Unclearable(Exception):
    """The round cannot be cleared; its message is the reason the round fails with."""


def _solve_placeable(
    rnd: Round, *, left_out: dict[int, str]
) -> tuple[RoundData, RoundOutcome, dict[int, str]]:
    """Solve the round; a gang that won GPUs no node can hold together is cleared out, never
    charged for GPUs it cannot use, and the round is solved again without it."""
    misplaced: dict[int, str] = {}
    for _attempt in range(PLACEMENT_ATTEMPTS):
        data = round_data(rnd, left_out=frozenset(left_out) | frozenset(misplaced))
        try:
            outcome = solve(data=data, policy=rnd.policy)
        except clearing.ClearingError as exc:
            logger.error("round %s: solver failed: %s", rnd.pk, exc)
            raise _Unclearable(f"the solver could not clear this round: {exc}") from exc
        misfits = placement_misfits(
            rnd=rnd,
            awards=outcome.awards(data),
            gang={int(b): int(m) > 1 for b, m in zip(data.bid_ids, data.min_quantity, strict=True)},
            tenant={int(b): int(t) for b, t in zip(data.bid_ids, data.tenant_ids, strict=True)},
        )
        if not misfits:
            return data, outcome, misplaced
        misplaced |= misfits
    raise _Unclearable(f"gangs still could not be placed after {PLACEMENT_ATTEMPTS} clearings")


def _outcome_store(
    rnd: Round,
    *,
    data: RoundData,
    outcome: RoundOutcome,
    left_out: dict[int, str],
    misplaced: dict[int, str],
    now: datetime,
) -> None:
    """The round's capacities, prices, awards, diagnostics and shadow comparison, saved with
    the round ``cleared``."""
    rnd.capacities = dict(zip(data.tier_slugs, (int(c) for c in data.capacity), strict=True))
    rnd.prices = outcome.prices
    rnd.awards = outcome.awards(data)
    rnd.diagnostics = outcome.diagnostics | {
        "expected_revenue": outcome.revenue(data),
        "bids": int(data.bid_ids.size),
        "left_out_by_hard_cap": {str(pk): why for pk, why in left_out.items()},
        "left_out_by_placement": {str(pk): why for pk, why in misplaced.items()},
    }
    absent = teams_left_out(bid_ids=set(left_out) | set(misplaced), cleared=data)
    rnd.diagnostics |= jain_counting_left_out(
        rnd.diagnostics, cleared_teams=int(np.unique(data.tenant_ids).size), left_out_teams=absent
    )
    rnd.shadow_result = _shadow(rnd=rnd, data=data, left_out_teams=absent)
    rnd.status = Round.Status.CLEARED
    rnd.cleared_at = now
    rnd.save(
        update_fields=[
            "capacities",
            "prices",
            "awards",
            "diagnostics",
            "shadow_policy",
            "shadow_result",
            "status",
            "cleared_at",
        ]
    )


def _clear_record(rnd: Round, *, bids: int) -> None:
    audit.record(
        actor="system",
        action="round.clear",
        target=rnd,
        before={"status": Round.Status.CLOSED},
        after={
            "status": rnd.status,
            "mechanism": rnd.policy.mechanism,
            "policy": rnd.policy.number,
            "bids": bids,
            "awards": len(rnd.awards),
            "prices": rnd.prices,
            "capacities": rnd.capacities,
            "shadow": rnd.shadow_policy.number if rnd.shadow_policy_id else None,
        },
    )


def teams_left_out(*, bid_ids: set[int], cleared: RoundData) -> int:
    """How many teams have bids among ``bid_ids`` and none among the ``cleared`` ones."""
    if not bid_ids:
        return 0
    teams = set(Bid.objects.filter(pk__in=bid_ids).values_list("tenant_id", flat=True))
    return len(teams - set(cleared.tenant_ids.tolist()))


def _over_hard_caps(rnd: Round, *, now: datetime) -> dict[int, str]:
    """The open bids left out of this round because they could take their tenant past a hard
    spend cap: {bid id: why}. Each tenant's bids are admitted oldest first, each that fits the
    room the earlier ones left (see tenants.budgets.hard_cap_admit); the others lose at
    settlement with their escrow back."""
    rows = (
        Bid.objects.filter(round=rnd, status=Bid.Status.OPEN)
        .order_by("tenant_id", "pk")
        .values_list("tenant_id", "pk", "campaign_id", "escrow")
    )
    by_tenant: dict[int, list[tuple[int, int | None, int]]] = {}
    for tenant_id, pk, campaign_id, escrow in rows:
        by_tenant.setdefault(tenant_id, []).append((pk, campaign_id, escrow))
    capped = set(
        Budget.objects.filter(
            tenant_id__in=by_tenant, active=True, mode=Budget.Mode.HARD
        ).values_list("tenant_id", flat=True)
    )
    left_out: dict[int, str] = {}
    for tenant in Tenant.objects.filter(pk__in=capped).order_by("pk"):
        left_out |= hard_cap_admit(tenant=tenant, commitments=by_tenant[tenant.pk], at=now)
    return left_out


def _shadow(*, rnd: Round, data: RoundData, left_out_teams: int = 0) -> dict[str, Any] | None:
    """The same bids under the shadow policy (the round's, else the current one), for
    side-by-side comparison; a shadow solver failure is recorded and does not affect the
    round."""
    if rnd.shadow_policy is None:
        rnd.shadow_policy = PolicyVersion.objects.filter(status=PolicyVersion.Status.SHADOW).first()
    shadow = rnd.shadow_policy
    if shadow is None or shadow.pk == rnd.policy_id:
        return None
    return _jsonable(round_replay(data=data, policy=shadow, left_out_teams=left_out_teams))


def round_replay(
    *, data: RoundData, policy: PolicyVersion, left_out_teams: int = 0
) -> dict[str, Any]:
    """A round's bids cleared again under ``policy``, summarised; nothing is written. The one
    replay of a clearing: the shadow comparison stores it with the round, the policy replay
    (market/policy/replay.py) sets it beside what the round did. Fairness counts the
    ``left_out_teams`` the round left out, as the round's own figure does. A solver error
    comes back as ``{"error": ...}``, never raised."""
    try:
        summary = _summary(solve(data=data, policy=policy), data, policy)
    except clearing.ClearingError as exc:
        return {
            "policy": policy.pk,
            "number": policy.number,
            "mechanism": policy.mechanism,
            "error": str(exc),
        }
    counted = jain_counting_left_out(
        summary["diagnostics"],
        cleared_teams=int(np.unique(data.tenant_ids).size),
        left_out_teams=left_out_teams,
    )
    if counted:
        summary["diagnostics"] = summary["diagnostics"] | counted
        summary["fairness"] = counted[JAIN]
    return summary
