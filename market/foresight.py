"""What the recent rounds say about a standing order's future: how often its values would
have won, when it should finish, and what it must bid to finish by its deadline. Pure Python
(no Django); ``market.selectors.order_foresight`` feeds it the rounds' clearing prices.

Units: prices and values in milli-credits per GPU-hour, work in GPU-seconds, windows in
seconds.

The estimate is the recent past taken as the future. A round would have been won by a value
``v`` when some tier the order accepts cleared at or below ``v`` (a round's cheapest
acceptable price is its cost to the order); the win rate is the share of recent rounds so
won. Each won window gives the order its GPUs for the whole window, so the windows still
needed are ``ceil(remaining / (gpus x window))`` and they take ``needed / win rate``
windows of wall-clock time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Foresight:
    rounds: int  # recent rounds looked at
    win_rate: float | None  # share of them its values would have won; None: no history
    windows_needed: int | None  # windows it must still win; None: runs until cancelled
    eta: datetime | None  # when it should finish; None: see eta_reason
    eta_reason: str  # why there is no ETA ("" when there is one)
    # With a deadline: the lowest value per GPU-hour (on its cheapest tier) at which the
    # recent rounds would have let it finish in time; None: see needed_reason.
    needed_value: int | None = None
    needed_reason: str = ""


def round_costs(prices: Sequence[Mapping[str, int]], tiers: Sequence[str]) -> list[int | None]:
    """Per round, the cheapest clearing price among ``tiers`` (None: none of them cleared)."""
    costs = []
    for row in prices:
        seen = [int(row[t]) for t in tiers if row.get(t) is not None]
        costs.append(min(seen) if seen else None)
    return costs


def rounds_won(*, prices: Sequence[Mapping[str, int]], values: Mapping[str, int]) -> int:
    """Rounds in which some tier cleared at or below the order's value for that tier."""
    return sum(
        1
        for row in prices
        if any(row.get(t) is not None and int(row[t]) <= v for t, v in values.items())
    )


def foresee(
    *,
    prices: Sequence[Mapping[str, int]],
    values: Mapping[str, int],
    gpus: int,
    remaining_gpu_seconds: int | None,
    window_seconds: int,
    now: datetime,
    deadline: datetime | None = None,
) -> Foresight:
    """The foresight for an order with ``values`` ({tier: milli-credits per GPU-hour}) that
    asks ``gpus`` GPUs a window and still wants ``remaining_gpu_seconds`` (None: until
    cancelled), from recent rounds' clearing ``prices`` ([{tier: price}], any order)."""
    if gpus < 1 or window_seconds < 1:
        raise ValueError("gpus and window_seconds must be positive")
    n = len(prices)
    rate = rounds_won(prices=prices, values=values) / n if n else None
    if remaining_gpu_seconds is None:
        return Foresight(n, rate, None, None, "it runs until cancelled")
    needed = max(math.ceil(remaining_gpu_seconds / (gpus * window_seconds)), 0)
    if needed == 0:
        return Foresight(n, rate, 0, now, "")
    eta, eta_reason = None, ""
    if rate is None:
        eta_reason = "no round has cleared yet, so there is no price history"
    elif rate == 0:
        eta_reason = (
            f"its values would have won none of the last {n} rounds; raise them to at "
            "least the recent clearing prices"
        )
    else:
        eta = now + timedelta(seconds=math.ceil(needed / rate) * window_seconds)
    needed_value, needed_reason = None, ""
    if deadline is not None:
        needed_value, needed_reason = _needed_value(
            prices=prices,
            tiers=sorted(values),
            needed=needed,
            windows_left=int((deadline - now).total_seconds() // window_seconds),
        )
    return Foresight(n, rate, needed, eta, eta_reason, needed_value, needed_reason)


def _needed_value(
    *, prices: Sequence[Mapping[str, int]], tiers: Sequence[str], needed: int, windows_left: int
) -> tuple[int | None, str]:
    """The lowest value that would have won at least ``needed / windows_left`` of the rounds."""
    if windows_left < needed:
        return None, (
            f"it cannot finish by then at any price: it needs {needed} more window(s) and "
            f"only {max(windows_left, 0)} remain"
        )
    costs = sorted(c for c in round_costs(prices, tiers) if c is not None)
    if not prices:
        return None, "no round has cleared yet, so there is no price history"
    # Rounds it must win out of the len(prices) seen, for the share needed/windows_left.
    must = math.ceil(needed * len(prices) / windows_left)
    if must > len(costs):
        return None, (
            f"it cannot finish by then at any recent price: its tiers cleared in only "
            f"{len(costs)} of the last {len(prices)} rounds and it needs {must}"
        )
    return costs[must - 1], ""
