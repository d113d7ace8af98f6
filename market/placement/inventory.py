"""Where placement learns which GPUs a tier has. The GPUs are telemetry's (the nodes report
them), and telemetry sits above market, so telemetry registers its source here when its app
is ready instead of market importing it. Pure: no Django."""

from __future__ import annotations

from collections.abc import Callable

from market.placement import FreeGpu

Source = Callable[[str], list[FreeGpu]]
_source: Source | None = None


def inventory_register(source: Source) -> None:
    """``source(tier_slug)`` -> the tier's placeable GPUs: healthy, not in maintenance, on a
    healthy node that is not revoked."""
    global _source
    _source = source


def tier_gpus(tier_slug: str) -> list[FreeGpu]:
    """The tier's placeable GPUs ([] when no source is registered or no node reports any)."""
    return _source(tier_slug) if _source is not None else []
