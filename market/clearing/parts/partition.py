"""Partitioned clearing for very large rounds: split the round into k sub-markets, clear each
on its own (in parallel, wherever ``map_parts`` runs them), and combine.

The split follows the partitioned-optimisation idea of Narayanan et al. (SOSP'21, "POP"):
resources and jobs are divided into k random parts of about equal size and each part is
solved as a smaller copy of the whole problem. Here:

- tenants, not bids, are the unit: all of a tenant's bids land in one part, so its share cap,
  its budget, its guarantee and its gangs hold exactly as in the exact clear (each stated
  against its part's capacity);
- tenants are shuffled with ``seed`` and dealt to the part with the fewest bids so far, so
  parts are balanced by bids even when tenants differ in size;
- each tier's GPUs are split as evenly as whole GPUs allow, in proportion to the bids each
  part holds;
- the split works on the instance's arrays (``instance_arrays``), not on bid objects: a part
  is the arrays of its tenants, cleared by ``clear_arrays`` and sent to a worker as columns
  (``columns.py``), so a million bids are never a million Python objects on the way;
- each part has its own clearing price per tier, and each winner pays its own part's price
  (never above its limit). The combined ``prices`` are each tier's GPU-weighted mean price;
  ``diagnostics["part_prices"]`` lists every part's.

What is lost against the exact clear: trades across parts (a high bid in one part cannot take
a GPU that went unsold or to a lower bid in another). ``bench/clearing.py --parts`` measures it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from market.clearing.errors import ClearingError
from market.clearing.instance.inputs import Arrays
from market.clearing.instance.result import Awards, Result, gpus_column

# A part's clear: its arrays in, ``part_result_to_json`` of its result out (the same JSON
# whether the part was cleared here or by a worker).
ClearPart = Callable[[Arrays], dict[str, Any]]


@dataclass(frozen=True)
class Part:
    arrays: Arrays
    tenants: np.ndarray  # (N_part,) index of each of its tenants in the whole
    bids: np.ndarray  # (B_part,) index of each of its bids in the whole


def split(arrays: Arrays, parts: int, *, seed: int = 0) -> list[Part]:
    """Split ``arrays`` into ``parts`` sub-instances (see the module docstring), each with the
    indices of its tenants and bids in the whole."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ClearingError(f"parts: must be a whole number >= 1, got {parts!r}")
    a = arrays
    bids_per_tenant = np.bincount(a.bid_tenant, minlength=a.n_tenants)
    bidding = np.flatnonzero(bids_per_tenant)
    parts = max(1, min(parts, int(bidding.size)))
    rng = np.random.default_rng(seed)
    shuffled = bidding[rng.permutation(bidding.size)]
    # Largest first, dealt to the lightest part: balanced by bids, random among equals.
    order = shuffled[np.argsort(-bids_per_tenant[shuffled], kind="stable")]
    part_of = np.full(a.n_tenants, -1, dtype=np.int64)
    lightest = [(0, p) for p in range(parts)]  # (bids so far, part): ties to the lower part
    for tenant, count in zip(order.tolist(), bids_per_tenant[order].tolist(), strict=True):
        load, p = heapq.heappop(lightest)
        part_of[tenant] = p
        heapq.heappush(lightest, (load + count, p))
    load = np.bincount(part_of[bidding], weights=bids_per_tenant[bidding], minlength=parts)
    total = int(load.sum())
    # Tenants, bids and arcs grouped by part in one stable sort each (their order kept within
    # a part), so each part is a slice: no pass over the whole arrays per part.
    tenants = _grouped(part_of, parts)
    bid_part = part_of[a.bid_tenant]
    bids = _grouped(bid_part, parts)
    arcs = _grouped(bid_part[a.arc_bid], parts)
    # The names taken by index from arrays of them: a tuple's item by item is 4 times as long
    # for a million bids, most of it fetching names scattered in memory.
    tenant_names = np.array(a.tenant_names, dtype=object)
    bid_ids = np.array(a.bid_ids, dtype=object)
    out = []
    for p in range(parts):
        ts, bs, es = tenants.members(p), bids.members(p), arcs.members(p)
        sub = replace(
            a,
            tenant_names=tuple(tenant_names[ts].tolist()),
            bid_ids=tuple(bid_ids[bs].tolist()),
            capacity=_shares(a.capacity, load, p, total),
            weight=a.weight[ts],
            budget=a.budget[ts],
            bid_tenant=tenants.local[a.bid_tenant[bs]],
            quantity=a.quantity[bs],
            min_quantity=a.min_quantity[bs],
            mixed_tiers=a.mixed_tiers[bs],
            arc_bid=bids.local[a.arc_bid[es]],
            arc_tier=a.arc_tier[es],
            arc_price=a.arc_price[es],
        )
        out.append(Part(arrays=sub, tenants=ts, bids=bs))
    return out


@dataclass(frozen=True)
class _Groups:
    order: np.ndarray  # indices, grouped by part, in their own order within a part
    bounds: np.ndarray  # (parts + 1,) where each part's run starts in ``order``
    local: np.ndarray  # each index's position within its part (-1: in none)

    def members(self, part: int) -> np.ndarray:
        return self.order[self.bounds[part] : self.bounds[part + 1]]


def _grouped(part_of: np.ndarray, parts: int) -> _Groups:
    # Part numbers fit 16 bits in practice, where numpy's stable sort is a radix sort.
    key = part_of.astype(np.int16) if parts < 2**15 else part_of
    order = np.argsort(key, kind="stable")
    order = order[part_of[order] >= 0]  # tenants without a bid are in no part
    bounds = np.searchsorted(part_of[order], np.arange(parts + 1))
    local = np.full(part_of.size, -1, dtype=np.int64)
    local[order] = np.arange(order.size) - np.repeat(bounds[:-1], np.diff(bounds))
    return _Groups(order=order, bounds=bounds, local=local)


def _shares(capacity: np.ndarray, load: np.ndarray, part: int, total: int) -> np.ndarray:
    """Whole GPUs of every tier for ``part``, proportional to its bids (largest remainders)."""
    if total == 0:
        return capacity.copy() if part == 0 else np.zeros_like(capacity)
    out = np.empty_like(capacity)
    for t, gpus in enumerate(capacity.tolist()):
        exact = load * gpus / total
        whole = np.floor(exact)
        short = int(round(gpus - whole.sum()))
        # Ties go to the lower part index, so the split is deterministic.
        extra = np.argsort(-(exact - whole), kind="stable")[:short]
        whole[extra] += 1
        out[t] = whole[part]
    return out


def clear_part(
    part: Arrays,
    *,
    mechanism: str,
    params: Mapping[str, Any] | None = None,
    reserved_quotas: Mapping[str, Mapping[str, float]] | str | None = None,
) -> dict[str, Any]:
    """Clear one part and return its result as ``combine`` takes it (what a worker runs).

    Parts are cleared side by side, a process each, so the numerical libraries' own thread
    pools (BLAS) are held to one thread: theirs would only contend with the other parts'
    processes for the same cores (a million fisher bids in 32 parts on 2 processes: 53.6 s
    with them, 22.3 s without; docs/clearing.md)."""
    from market.clearing import clear_arrays

    with threadpool_limits(limits=1):
        result = clear_arrays(
            part, mechanism=mechanism, params=params, reserved_quotas=reserved_quotas
        )
    return part_result_to_json(result, part)


def part_result_to_json(result: Result, part: Arrays) -> dict[str, Any]:
    """A part's result as it goes back from a worker: allocations, charges and spend as
    columns of the part's own indices (not one object per allocation)."""
    won = result.awards
    if won.bid_ids != part.bid_ids or won.tier_names != part.tier_names:
        raise ClearingError("a part's result is not in the part's own bid and tier order")
    bid_index = dict(zip(part.bid_ids, range(part.n_bids), strict=True))
    return {
        "allocations": {
            "bid": won.bid.tolist(),
            "tier": won.tier.tolist(),
            "gpus": won.gpus.tolist(),
        },
        "charges": {
            "bid": list(map(bid_index.__getitem__, result.charges)),
            "amount": list(result.charges.values()),
        },
        "prices": [result.prices[name] for name in part.tier_names],
        "spend": [result.spend.get(name, 0.0) for name in part.tenant_names],
        "diagnostics": {k: v for k, v in result.diagnostics.items() if k != "spend"},
    }


def combine(arrays: Arrays, parts: Sequence[Part], results: Sequence[Mapping[str, Any]]) -> Result:
    """One result from the parts' results (``part_result_to_json``): allocations, charges
    and spend side by side, in the whole's order."""
    if len(parts) != len(results):
        raise ClearingError(f"combine: {len(results)} results for {len(parts)} parts")
    a, T = arrays, arrays.n_tiers
    try:
        bid = np.concatenate(
            [
                p.bids[_indices(r["allocations"]["bid"], p.bids.size)]
                for p, r in _pairs(parts, results)
            ]
        )
        tier = np.concatenate([_indices(r["allocations"]["tier"], T) for r in results])
        gpus = gpus_column([g for r in results for g in r["allocations"]["gpus"]])
        charged = np.concatenate(
            [p.bids[_indices(r["charges"]["bid"], p.bids.size)] for p, r in _pairs(parts, results)]
        )
        amounts = [c for r in results for c in r["charges"]["amount"]]
        if gpus.size != bid.size or len(amounts) != charged.size:
            raise ValueError("columns of different lengths")
        part_prices = np.array([r["prices"] for r in results], dtype=float).reshape(-1, T)
        spend = np.zeros(a.n_tenants)
        for p, r in _pairs(parts, results):
            spend[p.tenants] += np.asarray(r["spend"], dtype=float).reshape(p.tenants.size)
        diags = [r["diagnostics"] for r in results]
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ClearingError(f"combine: a part's result is not as a part writes it ({exc})") from exc
    order = np.lexsort((tier, bid))
    awards = Awards(
        bid_ids=a.bid_ids,
        tier_names=a.tier_names,
        bid=bid[order],
        tier=tier[order],
        gpus=gpus[order],
    )
    charges = dict(zip([a.bid_ids[b] for b in charged.tolist()], amounts, strict=True))
    sold = np.zeros((len(results), T))
    part_index = np.repeat(np.arange(len(results)), [len(r["allocations"]["bid"]) for r in results])
    np.add.at(sold, (part_index, tier), gpus.astype(float))
    total = sold.sum(axis=0)
    combined = np.where(
        total > 0,
        np.divide((sold * part_prices).sum(axis=0), total, out=np.zeros(T), where=total > 0),
        part_prices.min(axis=0),
    )
    utilisation = np.divide(total, a.capacity, out=np.zeros(T), where=a.capacity > 0)
    ratios = [d["min_share_ratio"] for d in diags if d.get("min_share_ratio") is not None]
    statuses = {d["status"] for d in diags}
    spend_by_name = dict(zip(a.tenant_names, spend.tolist(), strict=True))
    diagnostics: dict[str, Any] = {
        "mechanism": diags[0]["mechanism"] if diags else "",
        "status": "optimal" if statuses <= {"optimal"} else ",".join(sorted(statuses)),
        "divisible": bool(diags and diags[0]["divisible"]),
        "partitioned": True,
        "parts": len(results),
        "part_bids": [p.arrays.n_bids for p in parts],
        "part_seconds": [d["total_seconds"] for d in diags],
        "part_prices": {name: part_prices[:, t].tolist() for t, name in enumerate(a.tier_names)},
        "welfare": float(sum(d["welfare"] for d in diags)),
        "utilisation": dict(zip(a.tier_names, utilisation.tolist(), strict=True)),
        # Fairness figures are those of each part (a tenant is compared with the tenants of
        # its own part): the worst part's ratio, and the sums of unmet guarantees and envy.
        "jain": min((d["jain"] for d in diags), default=1.0),
        "min_share_ratio": min(ratios) if ratios else None,
        "guarantees_unmet": sum(d["guarantees_unmet"] for d in diags),
        "envy_violations": sum(d["envy_violations"] for d in diags),
        "rounding_loss": float(sum(d["rounding_loss"] for d in diags)),
        "spend": spend_by_name,
    }
    return Result(
        awards=awards,
        prices=dict(zip(a.tier_names, combined.tolist(), strict=True)),
        charges=charges,
        spend=spend_by_name,
        diagnostics=diagnostics,
    )


def _indices(values: Any, size: int) -> np.ndarray:
    """Positions from a part's result, each in [0, size) (numpy would wrap a negative one)."""
    column = np.asarray(values, dtype=np.int64).reshape(-1)
    if column.size and (column.min() < 0 or column.max() >= size):
        raise IndexError(f"an index out of range (0 to {size - 1})")
    return column


def _pairs(parts: Sequence[Part], results: Sequence[Mapping[str, Any]]):
    return zip(parts, results, strict=True)


def clear_partitioned(
    arrays: Arrays,
    *,
    parts: int,
    clear_part: ClearPart,
    map_parts: Callable[[ClearPart, Iterable[Arrays]], Iterable[Mapping[str, Any]]] = map,
    seed: int = 0,
) -> Result:
    """Partition, clear each part with ``clear_part`` (run by ``map_parts``: the built-in map,
    a process pool's, or a Celery group's), and combine. A part that fails fails the whole
    clear: nothing of the other parts is returned."""
    start = time.perf_counter()
    pieces = split(arrays, parts, seed=seed)
    split_at = time.perf_counter()
    results = list(map_parts(clear_part, [p.arrays for p in pieces]))
    back_at = time.perf_counter()
    combined = combine(arrays, pieces, results)
    end = time.perf_counter()
    # Where the clear's time went in this process: the split, the parts (from the first sent
    # to the last back: the workers' time as this process waits for it) and the combination.
    diagnostics: Mapping[str, Any] = {
        **combined.diagnostics,
        "split_seconds": split_at - start,
        "parts_elapsed_seconds": back_at - split_at,
        "combine_seconds": end - back_at,
        "total_seconds": end - start,
    }
    return replace(combined, diagnostics=diagnostics)
