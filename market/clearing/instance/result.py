"""The clearing result and its JSON form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np


class Allocation(NamedTuple):
    bid: str
    tier: str
    gpus: float  # whole numbers unless cleared in divisible mode


def gpus_column(values: Sequence[float]) -> np.ndarray:
    """GPUs per award as read from a list: int64 when every one is an int (whole-GPU mode),
    float otherwise, so they go back out as the same Python types."""
    whole = all(type(g) is int for g in values)
    return np.array(values, dtype=np.int64 if whole else float).reshape(-1)


@dataclass(frozen=True, eq=False)
class Awards:
    """The allocations as columns, sorted by (bid, tier): ``bid`` and ``tier`` are positions
    in ``bid_ids`` and ``tier_names`` (the instance's bid and tier order), ``gpus`` int64 in
    whole-GPU mode, float otherwise. A million-bid round is read this way by the platform,
    without an object per award."""

    bid_ids: tuple[str, ...]  # the instance's bids, in id order
    tier_names: tuple[str, ...]  # the instance's tiers, in instance order
    bid: np.ndarray  # (A,) int64, a position in bid_ids per award
    tier: np.ndarray  # (A,) int64, a position in tier_names per award
    gpus: np.ndarray  # (A,) GPUs per award, > 0: int64 whole, float divisible

    @classmethod
    def of(cls, allocations: Sequence[Allocation]) -> Awards:
        """The columns of allocations given one by one (as the JSON form holds them)."""
        tiers = tuple(dict.fromkeys(a.tier for a in allocations))
        at = {name: t for t, name in enumerate(tiers)}
        return cls(
            bid_ids=tuple(a.bid for a in allocations),
            tier_names=tiers,
            bid=np.arange(len(allocations), dtype=np.int64),
            tier=np.fromiter((at[a.tier] for a in allocations), np.int64, len(allocations)),
            gpus=gpus_column([a.gpus for a in allocations]),
        )

    def allocations(self) -> tuple[Allocation, ...]:
        return tuple(
            map(
                Allocation._make,
                zip(
                    [self.bid_ids[b] for b in self.bid.tolist()],
                    [self.tier_names[t] for t in self.tier.tolist()],
                    self.gpus.tolist(),
                    strict=True,
                ),
            )
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Awards):
            return NotImplemented
        return self.allocations() == other.allocations()

    __hash__ = None  # mutable arrays inside


@dataclass(frozen=True)
class Result:
    awards: Awards  # what each bid won, as columns; ``allocations`` one by one
    prices: Mapping[str, float]  # tier -> credits/GPU-hour
    charges: Mapping[str, float]  # bid -> credits/hour, winners only
    spend: Mapping[str, float]  # tenant -> credits/hour
    diagnostics: Mapping[str, Any]

    @cached_property
    def allocations(self) -> tuple[Allocation, ...]:
        """Sorted by (bid id, tier order); made from ``awards`` when first asked for."""
        return self.awards.allocations()

    def to_json(self) -> dict[str, Any]:
        return {
            "allocations": [
                {"bid": a.bid, "tier": a.tier, "gpus": a.gpus} for a in self.allocations
            ],
            "prices": dict(self.prices),
            "charges": dict(self.charges),
            "diagnostics": dict(self.diagnostics),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result:
        """The result ``to_json`` wrote (spend is read from the diagnostics)."""
        diagnostics = dict(data["diagnostics"])
        return cls(
            awards=Awards.of(
                [Allocation(a["bid"], a["tier"], a["gpus"]) for a in data["allocations"]]
            ),
            prices=dict(data["prices"]),
            charges=dict(data["charges"]),
            spend=dict(diagnostics.get("spend", {})),
            diagnostics=diagnostics,
        )
