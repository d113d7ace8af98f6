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
- each part has its own clearing price per tier, and each winner pays its own part's price
  (never above its limit). The combined ``prices`` are each tier's GPU-weighted mean price;
  ``diagnostics["part_prices"]`` lists every part's.

What is lost against the exact clear: trades across parts (a high bid in one part cannot take
a GPU that went unsold or to a lower bid in another). ``bench/clearing.py --parts`` measures it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .errors import ClearingError
from .inputs import Instance, Tier
from .result import Allocation, Result

# Below this many bids the exact clear is the default; above it the platform may partition.
EXACT_BELOW_BIDS = 100_000

Clear = Callable[[Instance], Result]


def partition(instance: Instance, parts: int, *, seed: int = 0) -> tuple[Instance, ...]:
    """Split ``instance`` into ``parts`` sub-instances (see the module docstring)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ClearingError(f"parts: must be a whole number >= 1, got {parts!r}")
    bids_of: dict[str, list] = {t.name: [] for t in instance.tenants}
    for bid in instance.bids:
        bids_of[bid.tenant].append(bid)
    bidding = [t for t in instance.tenants if bids_of[t.name]]
    parts = max(1, min(parts, len(bidding)))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(bidding))
    # Largest first, dealt to the lightest part: balanced by bids, random among equals.
    order = sorted(order, key=lambda i: -len(bids_of[bidding[i].name]))
    load = [0] * parts
    members: list[list] = [[] for _ in range(parts)]
    for i in order:
        p = min(range(parts), key=load.__getitem__)
        members[p].append(bidding[i])
        load[p] += len(bids_of[bidding[i].name])
    total = sum(load)
    subs = []
    for p, tenants in enumerate(members):
        names = {t.name for t in tenants}
        quotas = instance.quotas
        if not isinstance(quotas, str):
            quotas = {k: v for k, v in quotas.items() if k in names}
        subs.append(
            Instance(
                tiers=tuple(
                    replace(tier, capacity=_share_of(tier, load, p, total))
                    for tier in instance.tiers
                ),
                tenants=tuple(tenants),
                bids=tuple(b for t in tenants for b in bids_of[t.name]),
                quotas=quotas,
            )
        )
    return tuple(subs)


def _share_of(tier: Tier, load: Sequence[int], part: int, total: int) -> int:
    """Whole GPUs of ``tier`` for ``part``, proportional to its bids (largest remainders)."""
    if total == 0:
        return tier.capacity if part == 0 else 0
    exact = np.array(load, dtype=float) * tier.capacity / total
    whole = np.floor(exact).astype(int)
    short = tier.capacity - int(whole.sum())
    # Ties go to the lower part index, so the split is deterministic.
    extra = np.argsort(-(exact - whole), kind="stable")[:short]
    whole[extra] += 1
    return int(whole[part])


def combine(instance: Instance, subs: Sequence[Instance], results: Sequence[Result]) -> Result:
    """One result from the parts' results: allocations, charges and spend side by side."""
    if len(subs) != len(results):
        raise ClearingError(f"combine: {len(results)} results for {len(subs)} parts")
    tier_order = {t.name: i for i, t in enumerate(instance.tiers)}
    allocations = sorted(
        (a for r in results for a in r.allocations), key=lambda a: (a.bid, tier_order[a.tier])
    )
    charges = {bid: c for r in results for bid, c in r.charges.items()}
    spend = {t.name: 0.0 for t in instance.tenants}
    for r in results:
        for tenant, s in r.spend.items():
            spend[tenant] += s
    part_prices = {t.name: [r.prices[t.name] for r in results] for t in instance.tiers}
    sold = {t.name: [0.0] * len(results) for t in instance.tiers}
    for p, r in enumerate(results):
        for a in r.allocations:
            sold[a.tier][p] += a.gpus
    prices = {}
    for tier in instance.tiers:
        gpus = np.array(sold[tier.name])
        ps = np.array(part_prices[tier.name])
        prices[tier.name] = float(gpus @ ps / gpus.sum()) if gpus.sum() > 0 else float(ps.min())
    used = {t.name: sum(sold[t.name]) for t in instance.tiers}
    diags = [r.diagnostics for r in results]
    ratios = [d["min_share_ratio"] for d in diags if d.get("min_share_ratio") is not None]
    statuses = {d["status"] for d in diags}
    diagnostics: dict[str, Any] = {
        "mechanism": diags[0]["mechanism"] if diags else "",
        "status": "optimal" if statuses <= {"optimal"} else ",".join(sorted(statuses)),
        "divisible": bool(diags and diags[0]["divisible"]),
        "partitioned": True,
        "parts": len(results),
        "part_bids": [len(s.bids) for s in subs],
        "part_seconds": [d["total_seconds"] for d in diags],
        "part_prices": part_prices,
        "welfare": float(sum(d["welfare"] for d in diags)),
        "utilisation": {
            t.name: (used[t.name] / t.capacity if t.capacity else 0.0) for t in instance.tiers
        },
        # Fairness figures are those of each part (a tenant is compared with the tenants of
        # its own part): the worst part's ratio, and the sums of unmet guarantees and envy.
        "jain": min((d["jain"] for d in diags), default=1.0),
        "min_share_ratio": min(ratios) if ratios else None,
        "guarantees_unmet": sum(d["guarantees_unmet"] for d in diags),
        "envy_violations": sum(d["envy_violations"] for d in diags),
        "rounding_loss": float(sum(d["rounding_loss"] for d in diags)),
        "spend": spend,
    }
    return Result(
        allocations=tuple(Allocation(*a) for a in allocations),
        prices=prices,
        charges=charges,
        spend=spend,
        diagnostics=diagnostics,
    )


def clear_partitioned(
    instance: Instance,
    *,
    parts: int,
    clear_part: Clear,
    map_parts: Callable[[Clear, Iterable[Instance]], Iterable[Result]] = map,
    seed: int = 0,
) -> Result:
    """Partition, clear each part with ``clear_part`` (run by ``map_parts``: the built-in map,
    a process pool's, or a Celery group's), and combine. A part that fails fails the whole
    clear: nothing of the other parts is returned."""
    start = time.perf_counter()
    subs = partition(instance, parts, seed=seed)
    results = list(map_parts(clear_part, subs))
    combined = combine(instance, subs, results)
    diagnostics: Mapping[str, Any] = {
        **combined.diagnostics,
        "total_seconds": time.perf_counter() - start,
    }
    return replace(combined, diagnostics=diagnostics)
