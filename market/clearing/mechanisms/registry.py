"""The mechanism registry: name -> solver function and its documented parameters.

A mechanism (welfare, fisher, maxmin) is the rule that turns bids into allocations and
prices; the market policy (a PolicyVersion on the Django side) chooses one and its
parameters. Parameters (``policy.params`` in the instance JSON):
- ``time_limit`` (seconds, default 10): wall-clock limit of each solver call. A
  mixed-integer solve (gang bids) that reaches it uses its incumbent or falls back; an LP
  that reaches it raises SolverError. welfare (gang MILP, LPs), maxmin (both stages), fisher
  (its conic solve, whose attempts share the limit, and its LPs).
- ``values`` (``{tenant: {tier: credits per GPU-hour}}``, default: each tenant's best limit on
  the tier): the value a tenant puts on a GPU of a tier. fisher and maxmin; a tier the
  tenant did not bid on stays worth 0 to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from market.clearing.errors import ClearingError
from market.clearing.mechanisms.fisher import fisher
from market.clearing.mechanisms.maxmin import maxmin
from market.clearing.mechanisms.rules import Market, Outcome
from market.clearing.mechanisms.welfare import welfare


@dataclass(frozen=True)
class Mechanism:
    run: Callable[[Market, Mapping[str, Any]], Outcome]
    defaults: Mapping[str, Any]


MECHANISMS: dict[str, Mechanism] = {
    "welfare": Mechanism(welfare, {"time_limit": 10.0}),
    "fisher": Mechanism(fisher, {"time_limit": 10.0, "values": None}),
    "maxmin": Mechanism(maxmin, {"time_limit": 10.0, "values": None}),
}


def mechanism_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults merged with the given parameters, each checked."""
    if name not in MECHANISMS:
        raise ClearingError(
            f"policy.name: unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}"
        )
    if params is not None and not isinstance(params, Mapping):
        raise ClearingError("policy.params: must be an object")
    merged = dict(MECHANISMS[name].defaults)
    for key, value in (params or {}).items():
        if key not in merged:
            known = ", ".join(merged) or "none"
            raise ClearingError(
                f"policy.params.{key}: unknown parameter for {name!r} (known: {known})"
            )
        merged[key] = value
    limit = merged.get("time_limit")
    if limit is not None and (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        raise ClearingError("policy.params.time_limit: must be a number of seconds > 0")
    return merged
