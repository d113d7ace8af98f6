"""Market clearing: instance in, result out. Pure Python + numpy + solvers; no Django.

from market.clearing import clear, Instance, Tier, Tenant, Bid
result = clear(instance, mechanism="welfare", params=None, divisible=False)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from market.clearing.errors import ClearingError, SolverError
from market.clearing.instance.inputs import (
    Arrays,
    Bid,
    Instance,
    Tenant,
    Tier,
    _finite_nonneg,
    instance_arrays,
)
from market.clearing.instance.result import Allocation, Awards, Result
from market.clearing.mechanisms.registry import MECHANISMS, mechanism_params
from market.clearing.mechanisms.rules import EPS, build_market, weight_quotas
from market.clearing.outcome.metrics import envy_count, jain, tenant_matrix
from market.clearing.solvers import bidsums, transport

__all__ = [
    "MECHANISMS",
    "Allocation",
    "Awards",
    "Bid",
    "ClearingError",
    "Instance",
    "Result",
    "SolverError",
    "Tenant",
    "Tier",
    "clear",
    "clear_arrays",
    "warm",
]


def warm() -> None:
    """Load the compiled kernels (transport.py's path search, bidsums.py's sums) from numba's
    cache, or compile them there the first time (about 5 s), by calling each once on one arc:
    a process that calls this first pays for it before its first round, not in it."""
    one, arc, blocks = np.zeros(1, dtype=np.int64), np.ones(1), np.array([[1, 0, 1]])
    transport.best_bundles(one, one, one, arc, arc, arc, 1)
    bidsums.per_bid(blocks, arc, arc, arc, arc)
    bidsums.tenant_terms(arc.copy(), arc, arc, arc, one, one, 1, 1)
    bidsums.z_times(blocks, arc, arc, arc, arc, one, one, arc, arc)
    bidsums.times(arc, arc, arc, one, arc, arc, one, arc, one, 1, 1, 1)
    bidsums.tier_sum(
        blocks, arc, arc, one, one, np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), 1, 1
    )


def _reserved_quotas(
    setting: Mapping[str, Mapping[str, float]] | str, a: Arrays, divisible: bool
) -> dict[tuple[int, int], float]:
    """The reserved quotas setting in indices. Tenants and tiers the arrays do not hold are left out
    (a part of a partitioned round holds some of the tenants)."""
    if setting == "by_weight":
        return weight_quotas(a, divisible=divisible)
    if not isinstance(setting, Mapping) or not all(
        isinstance(r, Mapping) for r in setting.values()
    ):
        raise ClearingError('reserved_quotas: must be "by_weight" or {tenant: {tier: GPUs}}')
    tenants = {name: i for i, name in enumerate(a.tenant_names)}
    tiers = {name: t for t, name in enumerate(a.tier_names)}
    quotas = {}
    for tenant, row in setting.items():
        for tier, gpus in row.items():
            gpus = _finite_nonneg(gpus, f"reserved_quotas.{tenant}.{tier}", "GPUs ")
            if gpus > 0 and tenant in tenants and tier in tiers:
                quotas[tenants[tenant], tiers[tier]] = gpus
    return quotas


def _whole_quantities(a: Arrays) -> None:
    """Whole GPUs asked for; bids are in id order, so the first named is the first by id."""
    at_fault = np.flatnonzero(
        (a.quantity != np.floor(a.quantity)) | (a.min_quantity != np.floor(a.min_quantity))
    )
    if at_fault.size:
        b = int(at_fault[0])
        field, value = next(
            (field, value)
            for field, value in (("quantity", a.quantity[b]), ("min_quantity", a.min_quantity[b]))
            if value != int(value)
        )
        raise ClearingError(
            f"bid {a.bid_ids[b]!r}.{field}: {value:g} is not a whole number of GPUs; "
            "round it, or clear divisibly"
        )


def clear(
    instance: Instance,
    *,
    mechanism: str = "welfare",
    params: Mapping[str, Any] | None = None,
    divisible: bool = False,
) -> Result:
    """Clear one round. Whole GPUs unless ``divisible`` (fractional GPU-hours, for analysis).

    ``clear_arrays`` of the instance's arrays (``instance_arrays``) and its reserved quotas:
    the one way into the mechanisms. Flattening the instance counts in the build and total
    seconds. Raises ClearingError for a bad mechanism, parameter or instance, SolverError (a
    ClearingError) when a solver ends without a proven result.
    """
    start = time.perf_counter()
    if not isinstance(instance, Instance):
        raise ClearingError("instance: must be a market.clearing.Instance")
    result = clear_arrays(
        instance_arrays(instance),
        mechanism=mechanism,
        params=params,
        divisible=divisible,
        reserved_quotas=instance.reserved_quotas,
    )
    d = result.diagnostics
    flattening = time.perf_counter() - start - d["total_seconds"]
    return replace(
        result,
        diagnostics={
            **d,
            "build_seconds": d["build_seconds"] + flattening,
            "total_seconds": d["total_seconds"] + flattening,
        },
    )


def clear_arrays(
    arrays: Arrays,
    *,
    mechanism: str = "welfare",
    params: Mapping[str, Any] | None = None,
    divisible: bool = False,
    reserved_quotas: Mapping[str, Mapping[str, float]] | str | None = None,
) -> Result:
    """Clear an instance in arrays (``instance_arrays``, a part of a partitioned round, or
    ``columns.arrays_from_json``); ``clear`` is this on an instance's arrays.
    ``reserved_quotas`` is the instance's setting by name; names not in the arrays are left out."""
    start = time.perf_counter()
    if not isinstance(arrays, Arrays):
        raise ClearingError("arrays: must be a market.clearing.instance.inputs.Arrays")
    chosen = mechanism_params(mechanism, params)
    if not divisible:
        _whole_quantities(arrays)
    market = build_market(
        arrays,
        divisible=divisible,
        reserved_quotas=_reserved_quotas(reserved_quotas or {}, arrays, divisible),
    )
    outcome = MECHANISMS[mechanism].run(market, chosen)

    a = arrays
    x = outcome.x if divisible else np.rint(outcome.x)
    x = np.where(x > EPS, x, 0.0)  # solver dust is neither allocated nor charged
    awards, charges, spend = _awards_and_charges(a, outcome, x, divisible=divisible)
    diagnostics = _diagnostics(
        a, market, outcome, x, mechanism=mechanism, divisible=divisible, spend=spend
    )
    total = time.perf_counter() - start
    solve, rounding = outcome.solve_seconds, outcome.rounding_seconds
    diagnostics.update(
        build_seconds=total - solve - rounding,
        solve_seconds=solve,
        rounding_seconds=rounding,
        total_seconds=total,
    )
    return Result(
        awards=awards,
        prices=dict(zip(a.tier_names, outcome.prices.tolist(), strict=True)),
        charges=charges,
        spend=diagnostics["spend"],
        diagnostics=diagnostics,
    )


def _awards_and_charges(
    a: Arrays, outcome: Any, x: np.ndarray, *, divisible: bool
) -> tuple[Awards, dict[str, float], np.ndarray]:
    """The GPUs won per (bid, tier), each winner's charge at min(price, limit), and each
    tenant's spend, never above a fisher budget (a tenant over it pays its budget, shared
    across its GPUs)."""
    price_arc = np.minimum(outcome.prices[a.arc_tier], a.arc_price)
    charge_arc = x * price_arc
    spend = np.bincount(a.arc_tenant, weights=charge_arc, minlength=a.n_tenants).astype(float)
    if outcome.budget_cap is not None:
        cap = outcome.budget_cap
        factor = np.minimum(1.0, np.divide(cap, spend, out=np.ones_like(spend), where=spend > 0))
        charge_arc = charge_arc * factor[a.arc_tenant]
        spend = np.bincount(a.arc_tenant, weights=charge_arc, minlength=a.n_tenants)
    charge_bid = np.bincount(a.arc_bid, weights=charge_arc, minlength=a.n_bids)
    won = np.flatnonzero(x > EPS)  # arcs are in (bid, tier) order, so the awards are too
    awards = Awards(
        bid_ids=a.bid_ids,
        tier_names=a.tier_names,
        bid=a.arc_bid[won],
        tier=a.arc_tier[won],
        gpus=x[won].astype(float if divisible else np.int64),
    )
    winners = np.unique(a.arc_bid[won])
    charges = dict(zip([a.bid_ids[b] for b in winners], charge_bid[winners].tolist(), strict=True))
    return awards, charges, spend


def _diagnostics(
    a: Arrays,
    market: Any,
    outcome: Any,
    x: np.ndarray,
    *,
    mechanism: str,
    divisible: bool,
    spend: np.ndarray,
) -> dict[str, Any]:
    """Welfare, utilisation, fairness (Jain's index and the least share ratio over the
    tenants with a fair share), guarantees unmet, envy, rounding loss and spend."""
    bundles = tenant_matrix(market, x)
    utility = np.bincount(a.arc_tenant, weights=outcome.arc_value * x, minlength=a.n_tenants)
    counted = outcome.fair > EPS
    ratios = utility[counted] / outcome.fair[counted]
    owed = outcome.guarantee > EPS
    unmet = utility[owed] < outcome.guarantee[owed] * (1.0 - 1e-6)
    used = np.bincount(a.arc_tier, weights=x, minlength=a.n_tiers)
    utilisation = np.divide(used, a.capacity, out=np.zeros(a.n_tiers), where=a.capacity > 0)
    return {
        "mechanism": mechanism,
        "status": outcome.status,
        "divisible": divisible,
        "welfare": float(x @ a.arc_price),
        "utilisation": dict(zip(a.tier_names, utilisation.tolist(), strict=True)),
        "jain": jain(ratios),
        "jain_tenants": int(ratios.size),  # the tenants Jain's index is taken over
        "min_share_ratio": float(ratios.min()) if ratios.size else None,
        "guarantees_unmet": int(unmet.sum()),
        "envy_violations": envy_count(
            outcome.values,
            bundles,
            outcome.entitlement,
            np.bincount(a.bid_tenant, weights=a.quantity, minlength=a.n_tenants),
        ),
        "rounding_loss": float(outcome.rounding_loss),
        "spend": dict(zip(a.tenant_names, spend.tolist(), strict=True)),
    }
