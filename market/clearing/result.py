"""The clearing result and its JSON form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


class Allocation(NamedTuple):
    bid: str
    tier: str
    gpus: float  # whole numbers unless cleared in divisible mode


@dataclass(frozen=True)
class Result:
    allocations: tuple[Allocation, ...]  # sorted by (bid id, tier order)
    prices: Mapping[str, float]  # tier -> credits/GPU-hour
    charges: Mapping[str, float]  # bid -> credits/hour, winners only
    spend: Mapping[str, float]  # tenant -> credits/hour
    diagnostics: Mapping[str, Any]

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
            allocations=tuple(
                Allocation(a["bid"], a["tier"], a["gpus"]) for a in data["allocations"]
            ),
            prices=dict(data["prices"]),
            charges=dict(data["charges"]),
            spend=dict(diagnostics.get("spend", {})),
            diagnostics=diagnostics,
        )
