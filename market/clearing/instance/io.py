"""JSON instances in, JSON results out. Every error names the field to fix.

Instance format::

    {"tiers":   [{"name": str, "capacity": int >= 0, "reserve_price": number >= 0 (0),
                  "max_share": number in (0, 1] (1)}],
     "tenants": [{"name": str, "weight": number >= 0 (1), "budget": number >= 0 | null (null)}],
     "bids":    [{"id": str, "tenant": str, "quantity": number >= 1,
                  "min_quantity": number >= 0 (0), "mixed_tiers": bool (false),
                  "limits": {"<tier>": number >= 0}}],
     "reserved_quotas": "by_weight" | {"<tenant>": {"<tier>": GPUs >= 0}} ({}),
     "policy":  {"name": "welfare" | "fisher" | "maxmin" ("welfare"), "params": {} ({})}}

"reserved_quotas" are GPUs set aside before the mechanism runs ("by_weight": each tenant's
weighted share of every tier it bids on, the per-tier split); without them every mechanism
holds the tenants' guarantee inside its own program. "policy.name" is the mechanism.

Defaults in parentheses; unknown fields are refused so that a misspelt field is not silently
ignored; the old key "quotas" is refused with a message naming "reserved_quotas". Bounds: prices, limits, reserves, budgets and weights at most MAX_AMOUNT (1e12);
capacities and quantities at most MAX_GPUS; names and ids at most MAX_NAME characters; the
file at most MAX_FILE_BYTES, UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from market.clearing.errors import ClearingError
from market.clearing.instance.inputs import MAX_AMOUNT, Bid, Instance, Tenant, Tier
from market.clearing.mechanisms.registry import mechanism_params

MAX_GPUS = 10**6  # capacity, quantity, min_quantity: ten times the platform's own cap
MAX_NAME = 200  # characters in a name, an id or any other key
MAX_FILE_BYTES = 64 * 2**20  # an instance of 100k bids is about 10 MiB

_MISSING = object()


def read_instance_file(path: str) -> Any:
    """The decoded JSON of an instance file. Raises OSError if it cannot be read, and
    ClearingError naming the file if it is too large, not UTF-8 or not JSON."""
    # Read one byte past the limit instead of asking for the size first: a pipe or a device
    # has no size, and a file may grow between the two calls.
    with open(path, "rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ClearingError(
            f"{path}: larger than {MAX_FILE_BYTES / 2**20:g} MiB ({MAX_FILE_BYTES} bytes); "
            "split the instance or drop what it does not need"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClearingError(
            f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8"
        ) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ClearingError(
            f"{path}: JSON nested too deeply (an instance needs at most 5 levels)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ClearingError(f"{path}: not valid JSON: {exc}") from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        raise ClearingError(
            f"{path}: a number has too many digits; no number may exceed {MAX_AMOUNT:g}"
        ) from None


def _shown(value: Any) -> str:
    """A value for an error message, short whatever its size."""
    if isinstance(value, int) and abs(value) > 10**15:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, str) and len(value) > MAX_NAME:
        return f"{value[:20]!r}... ({len(value)} characters)"
    return repr(value)


def _key(key: str, where: str) -> str:
    """``where.key``, refusing a key too long to name in a message."""
    if len(key) > MAX_NAME:
        raise ClearingError(
            f"{where}.{key[:20]}...: key of {len(key)} characters; at most {MAX_NAME}"
        )
    return f"{where}.{key}"


def _number(
    value: Any,
    where: str,
    *,
    low: float = 0.0,
    high: float = MAX_AMOUNT,
    what: str = f"a finite number >= 0 and at most {MAX_AMOUNT:g}",
    subject: str = "",
) -> float:
    """A number in [low, high]; ``subject`` reads before "must" (e.g. "price ")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClearingError(f"{where}: {subject}must be {what}, got {type(value).__name__}")
    # Compared without converting to float: 10**400 is refused, not an OverflowError, and
    # NaN fails both comparisons.
    if not low <= value <= high:
        raise ClearingError(f"{where}: {subject}must be {what}, got {_shown(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClearingError(f"{where}: must be a non-empty string")
    if len(value) > MAX_NAME:
        raise ClearingError(f"{where}: must be at most {MAX_NAME} characters, got {_shown(value)}")
    return value


def _fields(
    item: Any, where: str, spec: dict[str, tuple[Any, Callable[[Any, str], Any]]]
) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ClearingError(f"{where}: must be an object")
    for key in item:
        if key not in spec:
            raise ClearingError(f"{_key(key, where)}: unknown field (known: {', '.join(spec)})")
    out = {}
    for key, (default, check) in spec.items():
        value = item.get(key, default)
        if value is _MISSING:
            raise ClearingError(f"{where}.{key}: missing field")
        out[key] = check(value, f"{where}.{key}")
    return out


def _capacity(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
        raise ClearingError(
            f"{where}: must be a whole number of GPUs >= 0 and at most {MAX_GPUS}, "
            f"got {_shown(value)}"
        )
    return value


def _gpus(value: Any, where: str, *, low: float = 0.0) -> float:
    return _number(
        value, where, low=low, high=MAX_GPUS, what=f"a number >= {low:g} and at most {MAX_GPUS}"
    )


def _params(value: Any, where: str) -> Any:
    """Bounds the policy parameters' numbers and keys; policy_params and the policies check
    the rest (names, types, the tenants and tiers named)."""
    if not isinstance(value, dict):
        return value
    for key, param in value.items():
        at = _key(key, where)
        if key == "time_limit" and isinstance(param, int) and not isinstance(param, bool):
            _number(param, at, what=f"a number of seconds > 0 and at most {MAX_AMOUNT:g}")
        if key == "values" and isinstance(param, dict):
            for tenant, row in param.items():
                row_at = _key(tenant, at)
                for tier, price in row.items() if isinstance(row, dict) else ():
                    if isinstance(price, int | float):
                        _number(price, _key(tier, row_at), subject="value ")
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
    _check_top_level_keys(data)
    tiers = _tiers_from_json(data)
    tenants = _tenants_from_json(data)
    _unique([t["name"] for t in tiers], "tiers", "name")
    _unique([t["name"] for t in tenants], "tenants", "name")
    tier_names = {t["name"] for t in tiers}
    tenant_names = {t["name"] for t in tenants}
    bids = _bids_from_json(data, tier_names, tenant_names)
    _unique([b["id"] for b in bids], "bids", "id")
    policy_name, params = _policy_from_json(data)
    instance = Instance(
        tiers=tuple(Tier(**t) for t in tiers),
        tenants=tuple(Tenant(**t) for t in tenants),
        bids=tuple(Bid(**b) for b in bids),
        reserved_quotas=_reserved_quotas(data.get("reserved_quotas", {}), tenant_names, tier_names),
    )
    return instance, policy_name, params


def _check_top_level_keys(data: Any) -> None:
    """Refuse a non-object and any field the format does not know (naming the renamed one)."""
    if not isinstance(data, dict):
        raise ClearingError("instance: must be a JSON object with tiers, tenants and bids")
    for key in data:
        if key == "quotas":
            raise ClearingError('quotas: renamed; write "reserved_quotas" (same values)')
        if key not in ("tiers", "tenants", "bids", "reserved_quotas", "policy"):
            raise ClearingError(
                f"{key}: unknown field (known: tiers, tenants, bids, reserved_quotas, policy)"
            )


def _tiers_from_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each tier's checked fields, defaults filled in."""
    return [
        _fields(
            item,
            f"tiers[{i}]",
            {
                "name": (_MISSING, _text),
                "capacity": (_MISSING, _capacity),
                "reserve_price": (0.0, _number),
                "max_share": (1.0, _share),
            },
        )
        for i, item in enumerate(_list(data, "tiers"))
    ]


def _tenants_from_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each tenant's checked fields, defaults filled in."""
    number = _number
    return [
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


def _bids_from_json(
    data: dict[str, Any], tier_names: set[str], tenant_names: set[str]
) -> list[dict[str, Any]]:
    """Each bid's checked fields: known tenant, limits on known tiers, min_quantity <= quantity."""
    number = _number

    def tenant(value: Any, where: str) -> str:
        if _text(value, where) not in tenant_names:
            raise ClearingError(f"{where}: unknown tenant {value!r}")
        return value

    def limits(value: Any, where: str) -> dict[str, float]:
        if not isinstance(value, dict):
            raise ClearingError(f"{where}: must be an object {{tier: price}}")
        for tier, price in value.items():
            if tier not in tier_names:
                raise ClearingError(f"{_key(tier, where)}: unknown tier")
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
                "quantity": (_MISSING, lambda v, w: _gpus(v, w, low=1.0)),
                "min_quantity": (0.0, _gpus),
                "mixed_tiers": (False, _flag),
                "limits": (_MISSING, limits),
            },
        )
        if bid["min_quantity"] > bid["quantity"]:
            raise ClearingError(
                f"{where}.min_quantity: {bid['min_quantity']} is more than quantity "
                f"{bid['quantity']}"
            )
        bids.append(bid)
    return bids


def _policy_from_json(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The policy's name (default welfare) and its checked parameters."""
    policy = _fields(
        data.get("policy", {}),
        "policy",
        {
            "name": ("welfare", _text),
            "params": ({}, _params),
        },
    )
    return policy["name"], mechanism_params(policy["name"], policy["params"])


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ClearingError(f"{where}: must be true or false")
    return value


def _reserved_quotas(value: Any, tenants: set[str], tiers: set[str]) -> dict | str:
    """Shape only; Instance checks the names and the GPUs (same messages)."""
    if value != "by_weight" and not isinstance(value, dict):
        raise ClearingError(
            'reserved_quotas: must be "by_weight" or an object {tenant: {tier: GPUs}}'
        )
    for tenant, row in value.items() if isinstance(value, dict) else ():
        for tier in row if isinstance(row, dict) else ():
            _gpus(row[tier], _key(tier, _key(tenant, "reserved_quotas")))
    return value


def instance_to_json(
    instance: Instance, *, mechanism: str = "welfare", params: Any = None
) -> dict[str, Any]:
    """The JSON form ``instance_from_json`` reads back to an equal instance (used to send a
    part of a partitioned clear to a worker)."""
    data: dict[str, Any] = {
        "tiers": [
            {
                "name": t.name,
                "capacity": t.capacity,
                "reserve_price": t.reserve_price,
                "max_share": t.max_share,
            }
            for t in instance.tiers
        ],
        "tenants": [
            {"name": t.name, "weight": t.weight, "budget": t.budget} for t in instance.tenants
        ],
        "bids": [
            {
                "id": b.id,
                "tenant": b.tenant,
                "quantity": b.quantity,
                "min_quantity": b.min_quantity,
                "mixed_tiers": b.mixed_tiers,
                "limits": dict(b.limits),
            }
            for b in instance.bids
        ],
        "policy": {"name": mechanism, "params": dict(params or {})},
    }
    if instance.reserved_quotas:
        quotas = instance.reserved_quotas
        data["reserved_quotas"] = (
            quotas
            if isinstance(quotas, str)
            else {tenant: dict(row) for tenant, row in quotas.items()}
        )
    return data
