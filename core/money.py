"""Money as people read it. The ledger keeps integer milli-credits (1 credit = 1000);
pages, CSVs and messages show credits with three decimals."""

from __future__ import annotations

MILLI = 1000
SECONDS_PER_HOUR = 3600


def cost_ceil(*, gpus: int, price: int, seconds: int) -> int:
    """gpus x price (milli-credits per GPU-hour) x seconds/3600, rounded UP: an escrow, so a
    hold always covers the exact cost."""
    return -(-(gpus * price * seconds) // SECONDS_PER_HOUR)


def cost_floor(*, gpus: int, price: int, seconds: int) -> int:
    """The same product rounded DOWN: a charge or refund, so the sum of a winner's charges over
    several tiers never exceeds its escrow and a sub-milli-credit remainder favours the buyer."""
    return (gpus * price * seconds) // SECONDS_PER_HOUR


def credits(amount: int) -> str:
    """Milli-credits as a human string: 12345 -> '12.345'."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), MILLI)
    return f"{sign}{whole:,}.{frac:03d}"
