"""Money as people read it. The ledger keeps integer milli-credits (1 credit = 1000);
pages, CSVs and messages show credits with three decimals."""

from __future__ import annotations

MILLI = 1000


def credits(amount: int) -> str:
    """Milli-credits as a human string: 12345 -> '12.345'."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), MILLI)
    return f"{sign}{whole:,}.{frac:03d}"
