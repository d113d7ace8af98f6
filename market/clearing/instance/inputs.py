"""Instance dataclasses and their vectorised form.

Units: capacities and quantities are GPUs; prices, limits and reserves are credits per
GPU-hour; budgets are credits per hour. Floats are accepted here (the Django side passes
integers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np

from market.clearing.errors import ClearingError

# The largest price, limit, reserve, budget or weight accepted (in the caller's unit; the
# platform passes milli-credits and caps prices at 1e9). The LP solver takes a cost of 1e20 as
# infinite; eight orders of magnitude below that keeps its tolerances meaningful.
MAX_AMOUNT = 1e12


def _finite_nonneg(value: object, where: str, subject: str = "") -> float:
    # Compared before any conversion to float: an integer too large for a float is refused
    # rather than overflowing, and NaN fails both comparisons.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_AMOUNT
    ):
        if isinstance(value, int) and abs(value) > 10**15:  # never echo 400 digits back
            shown = f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        elif isinstance(value, int | float):
            shown = repr(value)
        else:
            shown = type(value).__name__
        raise ClearingError(
            f"{where}: {subject}must be a finite number >= 0 and at most {MAX_AMOUNT:g}, "
            f"got {shown}"
        )
    return float(value)


@dataclass(frozen=True)
class Tier:
    name: str
    capacity: int  # whole GPUs
    reserve_price: float = 0.0  # credits per GPU-hour
    max_share: float = 1.0  # fraction of capacity one tenant may get; 1 = no cap

    def __post_init__(self) -> None:
        where = f"tier {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ClearingError("tiers: name must be a non-empty string")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise ClearingError(f"{where}.capacity: must be a whole number of GPUs >= 0")
        if self.capacity < 0:
            raise ClearingError(f"{where}.capacity: must be >= 0, got {self.capacity}")
        _finite_nonneg(self.reserve_price, f"{where}.reserve_price")
        share = self.max_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ClearingError(f"{where}.max_share: must be in (0, 1], got {share!r}")


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0  # entitlement; 0 = no entitlement floor
    budget: float | None = None  # credits per hour; None = unlimited (fisher then uses 1)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClearingError("tenants: name must be a non-empty string")
        _finite_nonneg(self.weight, f"tenant {self.name!r}.weight")
        if self.budget is not None:
            _finite_nonneg(self.budget, f"tenant {self.name!r}.budget")


@dataclass(frozen=True)
class Bid:
    id: str
    tenant: str
    quantity: float  # GPUs wanted (>= 1)
    limits: Mapping[str, float] = field(default_factory=dict)  # tier -> credits/GPU-hour
    min_quantity: float = 0.0  # gang minimum; 0 = divisible, == quantity = all-or-nothing
    mixed_tiers: bool = False  # a gang may take its GPUs from several tiers

    def __post_init__(self) -> None:
        where = f"bid {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise ClearingError("bids: id must be a non-empty string")
        q = self.quantity
        if isinstance(q, bool) or not isinstance(q, int | float) or not math.isfinite(q) or q < 1:
            raise ClearingError(f"{where}.quantity: must be a number >= 1, got {q!r}")
        m = _finite_nonneg(self.min_quantity, f"{where}.min_quantity")
        if m > q:
            raise ClearingError(f"{where}.min_quantity: {m:g} is more than quantity {q:g}")
        if not isinstance(self.mixed_tiers, bool):
            raise ClearingError(f"{where}.mixed_tiers: must be true or false")
        for tier, price in self.limits.items():
            _finite_nonneg(price, f"{where}.limits.{tier}", "price ")
        # A private copy: later edits to the caller's dict cannot change a frozen bid.
        object.__setattr__(self, "limits", dict(self.limits))


@dataclass(frozen=True)
class Instance:
    tiers: tuple[Tier, ...]
    tenants: tuple[Tenant, ...]
    bids: tuple[Bid, ...]
    # Reserved quotas: {tenant: {tier: GPUs}} set aside before the mechanism runs (like a
    # nominal quota); "by_weight" sets each tenant's weighted share of every tier it bids on.
    # Empty (the default): no reservation; the guarantee holds inside each mechanism.
    reserved_quotas: Mapping[str, Mapping[str, float]] | str = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        object.__setattr__(self, "tenants", tuple(self.tenants))
        object.__setattr__(self, "bids", tuple(self.bids))
        for label, names in (
            ("tiers", [t.name for t in self.tiers]),
            ("tenants", [t.name for t in self.tenants]),
            ("bids", [b.id for b in self.bids]),
        ):
            if len(set(names)) != len(names):
                dup = sorted({n for n in names if names.count(n) > 1})[0]
                raise ClearingError(f"{label}: duplicate name or id {dup!r}")
        tiers = {t.name for t in self.tiers}
        tenants = {t.name for t in self.tenants}
        for bid in self.bids:
            if bid.tenant not in tenants:
                raise ClearingError(f"bid {bid.id!r}.tenant: unknown tenant {bid.tenant!r}")
            for tier in bid.limits:
                if tier not in tiers:
                    raise ClearingError(f"bid {bid.id!r}.limits: unknown tier {tier!r}")
        self._check_reserved_quotas(tiers, tenants)

    def _check_reserved_quotas(self, tiers: set[str], tenants: set[str]) -> None:
        quotas = self.reserved_quotas
        if isinstance(quotas, str):
            if quotas != "by_weight":
                raise ClearingError(
                    f'reserved_quotas: {quotas!r} is not a setting; use "by_weight" or '
                    "{tenant: {tier: GPUs}}"
                )
            return
        if not isinstance(quotas, Mapping):
            raise ClearingError("reserved_quotas: must be an object {tenant: {tier: GPUs}}")
        for tenant, row in quotas.items():
            if tenant not in tenants:
                raise ClearingError(f"reserved_quotas.{tenant}: unknown tenant")
            if not isinstance(row, Mapping):
                raise ClearingError(f"reserved_quotas.{tenant}: must be an object {{tier: GPUs}}")
            for tier, gpus in row.items():
                if tier not in tiers:
                    raise ClearingError(f"reserved_quotas.{tenant}.{tier}: unknown tier")
                _finite_nonneg(gpus, f"reserved_quotas.{tenant}.{tier}", "GPUs ")


@dataclass(frozen=True)
class Arrays:
    """The instance as flat arrays; bids sorted by id, arcs sorted by (bid, tier).

    An arc is an acceptable (bid, tier) pair: a limit at or above the tier's reserve.
    """

    tier_names: tuple[str, ...]
    tenant_names: tuple[str, ...]
    bid_ids: tuple[str, ...]
    capacity: np.ndarray  # (T,) GPUs
    reserve: np.ndarray  # (T,) credits/GPU-hour
    cap_share: np.ndarray  # (T,) max share in (0, 1]
    weight: np.ndarray  # (N,) entitlement weight
    budget: np.ndarray  # (N,) credits/hour; nan = unlimited
    bid_tenant: np.ndarray  # (B,) tenant index
    quantity: np.ndarray  # (B,) GPUs
    min_quantity: np.ndarray  # (B,) GPUs; 0 = divisible
    mixed_tiers: np.ndarray  # (B,) bool, a gang may span tiers
    arc_bid: np.ndarray  # (E,) bid index
    arc_tier: np.ndarray  # (E,) tier index
    arc_price: np.ndarray  # (E,) limit, credits/GPU-hour

    @property
    def n_tiers(self) -> int:
        return len(self.tier_names)

    @property
    def n_tenants(self) -> int:
        return len(self.tenant_names)

    @property
    def n_bids(self) -> int:
        return len(self.bid_ids)

    @property
    def arc_tenant(self) -> np.ndarray:  # (E,) tenant index
        return self.bid_tenant[self.arc_bid]


def instance_arrays(instance: Instance) -> Arrays:
    """Flatten the instance. One pass over the bid objects; everything after is numpy."""
    # Tenants by name and bids by id, so that the order of the input changes nothing.
    tiers, tenants = instance.tiers, tuple(sorted(instance.tenants, key=attrgetter("name")))
    tier_index = {t.name: i for i, t in enumerate(tiers)}
    tenant_index = {t.name: i for i, t in enumerate(tenants)}
    bids = sorted(instance.bids, key=attrgetter("id"))
    reserve = np.array([t.reserve_price for t in tiers], dtype=float)
    # map() over C-level callables keeps this single pass over the bid objects cheap.
    limits = list(map(attrgetter("limits"), bids))
    counts = np.fromiter(map(len, limits), dtype=np.int64, count=len(bids))
    arc_bid = np.repeat(np.arange(len(bids), dtype=np.int64), counts)
    arc_tier = np.fromiter(
        map(tier_index.__getitem__, chain.from_iterable(limits)), np.int64, count=arc_bid.size
    )
    arc_price = np.fromiter(
        chain.from_iterable(map(dict.values, limits)), dtype=float, count=arc_bid.size
    )
    keep = arc_price >= reserve[arc_tier] if arc_bid.size else np.zeros(0, dtype=bool)
    order = np.lexsort((arc_tier[keep], arc_bid[keep]))
    return Arrays(
        tier_names=tuple(t.name for t in tiers),
        tenant_names=tuple(t.name for t in tenants),
        bid_ids=tuple(b.id for b in bids),
        capacity=np.array([t.capacity for t in tiers], dtype=float),
        reserve=reserve,
        cap_share=np.array([t.max_share for t in tiers], dtype=float),
        weight=np.array([t.weight for t in tenants], dtype=float),
        budget=np.array([np.nan if t.budget is None else t.budget for t in tenants], dtype=float),
        bid_tenant=np.fromiter(
            map(tenant_index.__getitem__, map(attrgetter("tenant"), bids)), np.int64, len(bids)
        ),
        quantity=np.fromiter(map(attrgetter("quantity"), bids), float, len(bids)),
        min_quantity=np.fromiter(map(attrgetter("min_quantity"), bids), float, len(bids)),
        mixed_tiers=np.fromiter(map(attrgetter("mixed_tiers"), bids), bool, len(bids)),
        arc_bid=arc_bid[keep][order],
        arc_tier=arc_tier[keep][order],
        arc_price=arc_price[keep][order],
    )
