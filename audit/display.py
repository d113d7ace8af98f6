"""Audit payloads as a person reads them: amounts of money, stored in milli-credits (the
hashed record is never changed), shown in credits. Display only."""

from __future__ import annotations

import json
from typing import Any

from core.money import credits

# Keys whose value is money (milli-credits), or a mapping of money per tier, bid or tenant.
MONEY_KEYS = frozenset(
    {
        "amount", "cap", "escrow", "charge", "charged", "refunded", "revenue",
        "expected_revenue", "price", "prices", "reserve_prices", "limits", "spent", "held", "refunds",
        "remaining", "spend_max_per_window", "available", "balance",
        "energy_price", "energy_charge", "unpaid",
    }
)  # fmt: skip


def _money(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return credits(value)
    if isinstance(value, dict):
        return {k: _money(v) for k, v in value.items()}
    return value


def in_credits(value: Any) -> Any:
    """``value`` with every amount under a money key turned into a credits string."""
    if isinstance(value, dict):
        return {k: _money(v) if k in MONEY_KEYS else in_credits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [in_credits(v) for v in value]
    return value


def shown(value: Any) -> str:
    """The payload as indented JSON, amounts in credits; "—" when there is none."""
    if value is None:
        return "—"
    return json.dumps(in_credits(value), indent=1, sort_keys=True, ensure_ascii=False)
