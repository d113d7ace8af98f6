"""Small helpers shared by the market services: money arithmetic and argument checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from market.errors import MarketError

SECONDS_PER_HOUR = 3600
# Milli-credits per GPU-hour. A million credits per GPU-hour is far above any real price and
# keeps quantity x price x seconds well inside 64-bit integers.
MAX_PRICE = 10**9
MAX_GPUS = 100_000


def now_or(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if timezone.is_naive(now):
        raise MarketError("times must be timezone-aware")
    return now


def whole(value: Any, *, field: str, minimum: int, maximum: int) -> int:
    """An integer argument in [minimum, maximum]; a float, string or bool is refused, not cast,
    because 2.5 GPUs or a price of "10" is a caller's unit mistake."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MarketError(f"{field} must be a whole number, got {value!r}")
    if value < minimum:
        raise MarketError(f"{field} must be at least {minimum}, got {value}")
    if value > maximum:
        raise MarketError(f"{field} must be at most {maximum}, got {value}")
    return value


def cost_ceil(*, gpus: int, price: int, seconds: int) -> int:
    """gpus x price (milli-credits per GPU-hour) x seconds/3600, rounded UP: used for escrow,
    so a hold always covers the exact cost."""
    return -(-(gpus * price * seconds) // SECONDS_PER_HOUR)


def cost_floor(*, gpus: int, price: int, seconds: int) -> int:
    """The same product rounded DOWN: used for charges, so the sum of a winner's charges over
    several tiers can never exceed its escrow and a sub-milli-credit remainder favours the buyer."""
    return (gpus * price * seconds) // SECONDS_PER_HOUR
