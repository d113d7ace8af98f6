"""Tenant values shared by the fairness mechanisms (fisher, maxmin)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from market.clearing.errors import ClearingError
from market.clearing.mechanisms.rules import Market
from market.clearing.outcome.metrics import value_matrix


def tenant_values(market: Market, given: Mapping[str, Mapping[str, float]] | None) -> np.ndarray:
    """(N, T) credits/GPU-hour: the given values where set, else the best limit."""
    values = value_matrix(market)
    if given is None:
        return values
    a = market.arrays
    tenants = {name: i for i, name in enumerate(a.tenant_names)}
    tiers = {name: i for i, name in enumerate(a.tier_names)}
    if not isinstance(given, Mapping):
        raise ClearingError("policy.params.values: must be an object {tenant: {tier: value}}")
    bids_on = values > 0
    bids_on[a.arc_tenant, a.arc_tier] = True
    for tenant, row in given.items():
        if tenant not in tenants:
            raise ClearingError(f"policy.params.values.{tenant}: unknown tenant")
        if not isinstance(row, Mapping):
            raise ClearingError(f"policy.params.values.{tenant}: must be an object {{tier: value}}")
        for tier, value in row.items():
            where = f"policy.params.values.{tenant}.{tier}"
            if tier not in tiers:
                raise ClearingError(f"{where}: unknown tier")
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ClearingError(f"{where}: value must be a finite number >= 0")
            i, t = tenants[tenant], tiers[tier]
            if bids_on[i, t]:
                values[i, t] = float(value)
    return values
