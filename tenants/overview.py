"""What the staff overview shows of the apps above tenants. The market sits above tenants, so
it registers its source here when its app is ready instead of tenants importing it (the same
way telemetry hands placement its GPUs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Source = Callable[[], Sequence[Any]]
_hard_cap_blocks: Source | None = None


def hard_cap_blocks_register(source: Source) -> None:
    """``source()`` -> the teams a hard cap left bids of out of the latest cleared round
    (each with a ``tenant``)."""
    global _hard_cap_blocks
    _hard_cap_blocks = source


def hard_cap_blocks() -> Sequence[Any]:
    """The registered source's teams ([] when the market is not installed)."""
    return _hard_cap_blocks() if _hard_cap_blocks is not None else []
