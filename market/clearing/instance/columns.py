"""An instance's arrays as JSON columns: how a part of a partitioned round goes to a worker.

``io.instance_to_json`` writes one object per bid, and reading it back builds and checks a
``Bid`` per bid: at 250k bids, 2.6 s of a part's time went there and in its 35 MB of JSON.
Here the arrays (``inputs.Arrays``) travel as a few flat lists, and ``arrays_from_json``
checks them whole with numpy, so a worker trusts nothing it is sent:

    {"format": "gpumarket-arrays-2", "mechanism": ..., "params": {...}, "reserved_quotas": ...,
     "tiers":   {"name": [...], "capacity": [...], "reserve": [...], "max_share": [...]},
     "tenants": {"name": [...], "weight": [...], "budget": [... or null]},
     "bids":    {"id": [...], "tenant": [...], "quantity": [...], "min_quantity": [...],
                 "mixed_tiers": [...]},
     "arcs":    {"bid": [...], "tier": [...], "price": [...]}}

Indices are positions in the lists above; bids are in id order, tenants in name order and
arcs in (bid, tier) order with no arc below its tier's reserve, as ``instance_arrays`` makes
them, so the same arrays clear to the same result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from market.clearing.errors import ClearingError
from market.clearing.instance.inputs import MAX_AMOUNT, Arrays

# 2: the reserved quotas travel as "reserved_quotas" (1 called them "quotas").
FORMAT = "gpumarket-arrays-2"
# The numbers of a packed column (``arrays_to_json(packed=True)``), by field: little-endian
# float64 amounts, int32 indices (positions in a part's lists), one byte (0 or 1) a flag.
PACKED = {
    "weight": "<f8",
    "budget": "<f8",
    "tenant": "<i4",
    "quantity": "<f8",
    "min_quantity": "<f8",
    "mixed_tiers": "u1",
    "bid": "<i4",
    "tier": "<i4",
    "price": "<f8",
}
INDEX_LIMIT = 2**31  # positions a packed index column can hold


def arrays_to_json(
    arrays: Arrays,
    *,
    mechanism: str,
    params: Mapping[str, Any] | None,
    reserved_quotas: Mapping[str, Mapping[str, float]] | str | None = None,
    packed: bool = False,
) -> dict[str, Any]:
    """The arrays as columns. ``packed``: each numeric column as the bytes of its numbers
    (``PACKED``), for MessagePack, which carries bytes as they are, where a list is a number
    at a time to write, read and check (a part of a million-bid round: 15 ms to write and 35
    ms to read as lists); names stay lists. A tenant without a budget is NaN there."""
    a = arrays

    def column(values: np.ndarray, field: str) -> Any:
        if not packed:
            return values.tolist()
        if values.size and values.dtype.kind == "i" and values.max() >= INDEX_LIMIT:
            raise ClearingError(f"arrays.{field}: more than {INDEX_LIMIT} rows to pack")
        return np.ascontiguousarray(values, dtype=PACKED[field]).tobytes()

    return {
        "format": FORMAT,
        "mechanism": mechanism,
        "params": dict(params or {}),
        "reserved_quotas": reserved_quotas
        if isinstance(reserved_quotas, str)
        else dict(reserved_quotas or {}),
        "tiers": {
            "name": list(a.tier_names),
            "capacity": a.capacity.astype(np.int64).tolist(),
            "reserve": a.reserve.tolist(),
            "max_share": a.cap_share.tolist(),
        },
        "tenants": {
            "name": list(a.tenant_names),
            "weight": column(a.weight, "weight"),
            "budget": column(a.budget, "budget")
            if packed
            else [None if np.isnan(b) else b for b in a.budget.tolist()],
        },
        "bids": {
            "id": list(a.bid_ids),
            "tenant": column(a.bid_tenant, "tenant"),
            "quantity": column(a.quantity, "quantity"),
            "min_quantity": column(a.min_quantity, "min_quantity"),
            "mixed_tiers": column(a.mixed_tiers, "mixed_tiers"),
        },
        "arcs": {
            "bid": column(a.arc_bid, "bid"),
            "tier": column(a.arc_tier, "tier"),
            "price": column(a.arc_price, "price"),
        },
    }


def arrays_from_json(data: Any) -> tuple[Arrays, str, dict[str, Any], Any]:
    """(arrays, mechanism, params, reserved_quotas) from what ``arrays_to_json`` wrote. Raises
    ClearingError naming the first field that is not as written there."""
    mechanism, params, reserved_quotas = _header_from_json(data)
    tiers = _table(data, "tiers", ("name", "capacity", "reserve", "max_share"))
    tenants = _table(data, "tenants", ("name", "weight", "budget"))
    bids = _table(data, "bids", ("id", "tenant", "quantity", "min_quantity", "mixed_tiers"))
    arcs = _table(data, "arcs", ("bid", "tier", "price"))
    tier_names = _names(tiers["name"], "tiers.name", ordered=False)
    tenant_names = _names(tenants["name"], "tenants.name", ordered=True)
    bid_ids = _names(bids["id"], "bids.id", ordered=True)
    T, N, B = len(tier_names), len(tenant_names), len(bid_ids)

    capacity, reserve, cap_share = _tier_columns(tiers)
    weight, budget = _tenant_columns(tenants)
    bid_tenant, quantity, min_quantity, mixed_tiers = _bid_columns(bids, N)
    arc_bid, arc_tier, arc_price = _arc_columns(arcs, B, T, reserve)
    arrays = Arrays(
        tier_names=tier_names,
        tenant_names=tenant_names,
        bid_ids=bid_ids,
        capacity=capacity,
        reserve=reserve,
        cap_share=cap_share,
        weight=weight,
        budget=budget,
        bid_tenant=bid_tenant,
        quantity=quantity,
        min_quantity=min_quantity,
        mixed_tiers=mixed_tiers,
        arc_bid=arc_bid,
        arc_tier=arc_tier,
        arc_price=arc_price,
    )
    return arrays, mechanism, dict(params), reserved_quotas


def _header_from_json(data: Any) -> tuple[str, Mapping, Any]:
    """The format tag, then (mechanism, params, reserved_quotas), each checked for its type."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ClearingError(f"arrays: must be an object with format {FORMAT!r}")
    mechanism, params = data.get("mechanism"), data.get("params")
    reserved_quotas = data.get("reserved_quotas")
    if not isinstance(mechanism, str):
        raise ClearingError("arrays.mechanism: must be a string")
    if not isinstance(params, Mapping):
        raise ClearingError("arrays.params: must be an object")
    if not (reserved_quotas == "by_weight" or isinstance(reserved_quotas, Mapping)):
        raise ClearingError('arrays.reserved_quotas: must be "by_weight" or {tenant: {tier: GPUs}}')
    return mechanism, params, reserved_quotas


def _tier_columns(tiers: dict[str, list | bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(capacity in whole GPUs, reserve price, max share in (0, 1])."""
    capacity = _amounts(tiers["capacity"], "tiers.capacity")
    if np.any(capacity != np.floor(capacity)):
        raise ClearingError("arrays.tiers.capacity: must be whole GPUs")
    reserve = _amounts(tiers["reserve"], "tiers.reserve")
    cap_share = _amounts(tiers["max_share"], "tiers.max_share")
    if np.any((cap_share <= 0) | (cap_share > 1)):
        raise ClearingError("arrays.tiers.max_share: must be in (0, 1]")
    return capacity, reserve, cap_share


def _tenant_columns(tenants: dict[str, list | bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(weight, budget with NaN for a tenant without one), from a list or packed column."""
    weight = _amounts(tenants["weight"], "tenants.weight")
    budget_in = tenants["budget"]
    if isinstance(budget_in, bytes):  # packed: NaN for a tenant without a budget
        budget = _unpacked(budget_in, "tenants.budget")
        none = np.isnan(budget)
        _amounts(np.where(none, 0.0, budget), "tenants.budget")
    else:
        budget = _amounts([0.0 if b is None else b for b in budget_in], "tenants.budget")
        none = [b is None for b in budget_in]
    budget[none] = np.nan
    return weight, budget


def _bid_columns(
    bids: dict[str, list | bytes], N: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tenant index, quantity >= 1, min_quantity <= quantity, mixed_tiers flags)."""
    bid_tenant = _indices(bids["tenant"], "bids.tenant", N)
    quantity = _amounts(bids["quantity"], "bids.quantity")
    if np.any(quantity < 1):
        raise ClearingError("arrays.bids.quantity: must be >= 1 GPU")
    min_quantity = _amounts(bids["min_quantity"], "bids.min_quantity")
    if np.any(min_quantity > quantity):
        raise ClearingError("arrays.bids.min_quantity: must not be more than quantity")
    mixed_in = bids["mixed_tiers"]
    if isinstance(mixed_in, bytes):
        flags = _unpacked(mixed_in, "bids.mixed_tiers")
        if np.any(flags > 1):
            raise ClearingError("arrays.bids.mixed_tiers: must be true or false")
        mixed_tiers = flags.astype(bool)
    elif all(isinstance(m, bool) for m in mixed_in):
        mixed_tiers = np.array(mixed_in, dtype=bool)
    else:
        raise ClearingError("arrays.bids.mixed_tiers: must be true or false")
    return bid_tenant, quantity, min_quantity, mixed_tiers


def _arc_columns(
    arcs: dict[str, list | bytes], B: int, T: int, reserve: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bid index, tier index, price): in (bid, tier) order, each pair once, none below reserve."""
    arc_bid = _indices(arcs["bid"], "arcs.bid", B)
    arc_tier = _indices(arcs["tier"], "arcs.tier", T)
    arc_price = _amounts(arcs["price"], "arcs.price")
    key = arc_bid * max(T, 1) + arc_tier
    if key.size and np.any(np.diff(key) <= 0):
        raise ClearingError("arrays.arcs: must be in (bid, tier) order, each pair once")
    if np.any(arc_price < reserve[arc_tier]):
        raise ClearingError("arrays.arcs.price: an arc below its tier's reserve")
    return arc_bid, arc_tier, arc_price


def _table(data: Mapping, name: str, fields: tuple[str, ...]) -> dict[str, list | bytes]:
    table = data.get(name)
    if not isinstance(table, Mapping):
        raise ClearingError(f"arrays.{name}: must be an object of lists")
    columns, lengths = {}, set()
    for field in fields:
        column = table.get(field)
        if isinstance(column, bytes) and field in PACKED:
            size = np.dtype(PACKED[field]).itemsize
            if len(column) % size:
                raise ClearingError(f"arrays.{name}.{field}: not whole {size}-byte numbers")
            lengths.add(len(column) // size)
        elif isinstance(column, list):
            lengths.add(len(column))
        else:
            raise ClearingError(f"arrays.{name}.{field}: must be a list")
        columns[field] = column
    if len(lengths) > 1:
        raise ClearingError(f"arrays.{name}: its lists must be of one length")
    return columns


def _unpacked(column: bytes, where: str) -> np.ndarray:
    """A packed column's numbers, in the machine's byte order (a copy: the solver's arrays
    are its own). ``where`` is table.field."""
    packed = np.dtype(PACKED[where.rpartition(".")[2]])
    native = np.int64 if packed.kind == "i" else packed.newbyteorder("=")
    return np.frombuffer(column, dtype=packed).astype(native)


def _names(values: list, where: str, *, ordered: bool) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v for v in values):
        raise ClearingError(f"arrays.{where}: must be non-empty strings")
    if ordered and any(a >= b for a, b in zip(values, values[1:], strict=False)):
        raise ClearingError(f"arrays.{where}: must be in order, each once")
    if not ordered and len(set(values)) != len(values):
        raise ClearingError(f"arrays.{where}: each name once")
    return tuple(values)


def _amounts(values: list | bytes | np.ndarray, where: str) -> np.ndarray:
    if isinstance(values, bytes):
        column = _unpacked(values, where)
    elif isinstance(values, np.ndarray):
        column = values
    else:
        # bool is an int in Python; a number must be a number.
        if not all(type(v) in (int, float) for v in values):
            raise ClearingError(f"arrays.{where}: must be numbers")
        try:
            column = np.array(values, dtype=float)
        except OverflowError:
            raise ClearingError(f"arrays.{where}: a number too large") from None
    if not np.all(np.isfinite(column) & (column >= 0) & (column <= MAX_AMOUNT)):
        raise ClearingError(f"arrays.{where}: must be finite numbers >= 0, at most {MAX_AMOUNT:g}")
    return column


def _indices(values: list | bytes, where: str, size: int) -> np.ndarray:
    if isinstance(values, bytes):
        column = _unpacked(values, where)
    elif not all(type(v) is int for v in values):
        raise ClearingError(f"arrays.{where}: must be whole-number indices")
    else:
        try:
            column = np.array(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)
        except OverflowError:
            raise ClearingError(
                f"arrays.{where}: an index out of range (0 to {size - 1})"
            ) from None
    if column.size and (column.min() < 0 or column.max() >= size):
        raise ClearingError(f"arrays.{where}: an index out of range (0 to {size - 1})")
    return column
