"""JSON instances in, JSON results out. Every error names the field to fix.

Instance format::

    {"tiers":   [{"name": str, "capacity": int >= 0, "reserve_price": number >= 0 (0),
                  "max_share": number in (0, 1] (1)}],
     "tenants": [{"name": str, "weight": number >= 0 (1), "budget": number >= 0 | null (null)}],
     "bids":    [{"id": str, "tenant": str, "quantity": number >= 1,
                  "min_quantity": number >= 0 (0), "limits": {"<tier>": number >= 0}}],
     "policy":  {"name": "welfare" | "fisher" | "maxmin" ("welfare"), "params": {} ({})}}

Defaults in parentheses; unknown fields are refused so that a misspelt field is not silently
ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .errors import ClearingError
from .inputs import Bid, Instance, Tenant, Tier
from .mechanisms import mechanism_params

_MISSING = object()


def _number(
    value: Any,
    where: str,
    *,
    low: float = 0.0,
    what: str = "a finite number >= 0",
    subject: str = "",
) -> float:
    """A finite number >= low; ``subject`` reads before "must" (e.g. "price ")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClearingError(f"{where}: {subject}must be {what}, got {type(value).__name__}")
    if not math.isfinite(value) or value < low:
        raise ClearingError(f"{where}: {subject}must be {what}, got {value!r}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClearingError(f"{where}: must be a non-empty string")
    return value


def _fields(
    item: Any, where: str, spec: dict[str, tuple[Any, Callable[[Any, str], Any]]]
) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ClearingError(f"{where}: must be an object")
    for key in item:
        if key not in spec:
            raise ClearingError(f"{where}.{key}: unknown field (known: {', '.join(spec)})")
    out = {}
    for key, (default, check) in spec.items():
        value = item.get(key, default)
        if value is _MISSING:
            raise ClearingError(f"{where}.{key}: missing field")
        out[key] = check(value, f"{where}.{key}")
    return out


def _capacity(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClearingError(f"{where}: must be a whole number of GPUs >= 0, got {value!r}")
    return value


def _share(value: Any, where: str) -> float:
    _number(value, where, what="a number in (0, 1]")
    if not 0 < value <= 1:
        raise ClearingError(f"{where}: must be a number in (0, 1], got {value!r}")
    return value


def _list(data: dict, key: str) -> list:
    if key not in data:
        raise ClearingError(f"{key}: missing field")
    if not isinstance(data[key], list):
        raise ClearingError(f"{key}: must be a list")
    return data[key]


def _unique(names: list[str], label: str, field: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ClearingError(f"{label}[{i}].{field}: duplicate {field} {name!r}")
        seen.add(name)


def instance_from_json(data: Any) -> tuple[Instance, str, dict[str, Any]]:
    """Parse and check a decoded JSON instance: (instance, policy name, policy params)."""
    if not isinstance(data, dict):
        raise ClearingError("instance: must be a JSON object with tiers, tenants and bids")
    for key in data:
        if key not in ("tiers", "tenants", "bids", "policy"):
            raise ClearingError(f"{key}: unknown field (known: tiers, tenants, bids, policy)")
    number = _number
    tiers = [
        _fields(
            item,
            f"tiers[{i}]",
            {
                "name": (_MISSING, _text),
                "capacity": (_MISSING, _capacity),
                "reserve_price": (0.0, number),
                "max_share": (1.0, _share),
            },
        )
        for i, item in enumerate(_list(data, "tiers"))
    ]
    tenants = [
        _fields(
            item,
            f"tenants[{i}]",
            {
                "name": (_MISSING, _text),
                "weight": (1.0, number),
                "budget": (None, lambda v, w: None if v is None else number(v, w)),
            },
        )
        for i, item in enumerate(_list(data, "tenants"))
    ]
    _unique([t["name"] for t in tiers], "tiers", "name")
    _unique([t["name"] for t in tenants], "tenants", "name")
    tier_names = {t["name"] for t in tiers}
    tenant_names = {t["name"] for t in tenants}

    def tenant(value: Any, where: str) -> str:
        if _text(value, where) not in tenant_names:
            raise ClearingError(f"{where}: unknown tenant {value!r}")
        return value

    def limits(value: Any, where: str) -> dict[str, float]:
        if not isinstance(value, dict):
            raise ClearingError(f"{where}: must be an object {{tier: price}}")
        for tier, price in value.items():
            if tier not in tier_names:
                raise ClearingError(f"{where}.{tier}: unknown tier")
            number(price, f"{where}.{tier}", subject="price ")
        return value

    bids = []
    for i, item in enumerate(_list(data, "bids")):
        where = f"bids[{i}]"
        bid = _fields(
            item,
            where,
            {
                "id": (_MISSING, _text),
                "tenant": (_MISSING, tenant),
                "quantity": (_MISSING, lambda v, w: number(v, w, low=1.0, what="a number >= 1")),
                "min_quantity": (0.0, number),
                "limits": (_MISSING, limits),
            },
        )
        if bid["min_quantity"] > bid["quantity"]:
            raise ClearingError(
                f"{where}.min_quantity: {bid['min_quantity']} is more than quantity "
                f"{bid['quantity']}"
            )
        bids.append(bid)
    _unique([b["id"] for b in bids], "bids", "id")

    policy = _fields(
        data.get("policy", {}),
        "policy",
        {
            "name": ("welfare", _text),
            "params": ({}, lambda v, w: v),
        },
    )
    params = mechanism_params(policy["name"], policy["params"])
    instance = Instance(
        tiers=tuple(Tier(**t) for t in tiers),
        tenants=tuple(Tenant(**t) for t in tenants),
        bids=tuple(Bid(**b) for b in bids),
    )
    return instance, policy["name"], params
