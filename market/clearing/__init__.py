"""Market clearing: instance in, result out. Pure Python + numpy + solvers; no Django.

from market.clearing import clear, Instance, Tier, Tenant, Bid
result = clear(instance, policy="welfare", params=None, divisible=False)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ClearingError, SolverError
from .inputs import Bid, Instance, Tenant, Tier, instance_arrays
from .market import EPS, build_market
from .metrics import envy_count, equal_split_utility, jain, share_ratios, tenant_matrix
from .policies import POLICIES, policy_params
from .result import Allocation, Result

__all__ = [
    "POLICIES",
    "Allocation",
    "Bid",
    "ClearingError",
    "Instance",
    "Result",
    "SolverError",
    "Tenant",
    "Tier",
    "clear",
]


def clear(
    instance: Instance,
    *,
    policy: str = "welfare",
    params: Mapping[str, Any] | None = None,
    divisible: bool = False,
) -> Result:
    """Clear one round. Whole GPUs unless ``divisible`` (fractional GPU-hours, for analysis).

    Raises ClearingError for a bad policy or parameter, SolverError (a ClearingError) when a
    solver ends without a proven result.
    """
    start = time.perf_counter()
    if not isinstance(instance, Instance):
        raise ClearingError("instance: must be a market.clearing.Instance")
    chosen = policy_params(policy, params)
    arrays = instance_arrays(instance)
    market = build_market(arrays, divisible=divisible)
    outcome = POLICIES[policy].run(market, chosen)

    a = arrays
    x = outcome.x if divisible else np.rint(outcome.x)
    price_arc = np.minimum(outcome.prices[a.arc_tier], a.arc_price)
    charge_bid = np.bincount(a.arc_bid, weights=x * price_arc, minlength=a.n_bids)
    spend = np.bincount(a.bid_tenant, weights=charge_bid, minlength=a.n_tenants)
    won = np.flatnonzero(x > EPS)
    number = float if divisible else int
    gpus = x[won].astype(np.int64 if number is int else float).tolist()
    allocations = tuple(
        map(
            Allocation._make,
            zip(
                [a.bid_ids[b] for b in a.arc_bid[won].tolist()],
                [a.tier_names[t] for t in a.arc_tier[won].tolist()],
                gpus,
                strict=True,
            ),
        )
    )
    winners = np.unique(a.arc_bid[won])
    charges = dict(zip([a.bid_ids[b] for b in winners], charge_bid[winners].tolist(), strict=True))

    bundles = tenant_matrix(market, x)
    utility = (bundles * outcome.values).sum(axis=1)
    ratios = share_ratios(utility, a.weight, equal_split_utility(market, outcome.values))
    used = np.bincount(a.arc_tier, weights=x, minlength=a.n_tiers)
    utilisation = np.divide(used, a.capacity, out=np.zeros(a.n_tiers), where=a.capacity > 0)
    total = time.perf_counter() - start
    solve, rounding = outcome.solve_seconds, outcome.rounding_seconds
    diagnostics: dict[str, Any] = {
        "policy": policy,
        "status": outcome.status,
        "divisible": divisible,
        "welfare": float(x @ a.arc_price),
        "utilisation": dict(zip(a.tier_names, utilisation.tolist(), strict=True)),
        "jain": jain(ratios),
        "min_share_ratio": float(ratios.min()) if ratios.size else None,
        "envy_violations": envy_count(
            outcome.values,
            bundles,
            outcome.entitlement,
            np.bincount(a.bid_tenant, weights=a.quantity, minlength=a.n_tenants),
        ),
        "rounding_loss": float(outcome.rounding_loss),
        "spend": dict(zip(a.tenant_names, spend.tolist(), strict=True)),
    }
    total = time.perf_counter() - start
    diagnostics.update(
        build_seconds=total - solve - rounding,
        solve_seconds=solve,
        rounding_seconds=rounding,
        total_seconds=total,
    )
    return Result(
        allocations=allocations,
        prices=dict(zip(a.tier_names, outcome.prices.tolist(), strict=True)),
        charges=charges,
        spend=diagnostics["spend"],
        diagnostics=diagnostics,
    )
