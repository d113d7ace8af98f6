"""Standing orders as arithmetic: the bid an order makes in a round and what a round's result
does to it. Pure Python (no Django), so the platform's round opener and settlement
(market/services/orders/) and the simulator (market/simulator) run the same rules.

Units: money in milli-credits, values in milli-credits per GPU-hour, work in GPU-seconds.

Incumbency. An order that holds GPUs in the window ending as a round starts loses
``restart_seconds`` of work if it is moved or stopped (it restarts from its last checkpoint).
Its value for keeping its current tier is therefore its value for a window plus the work a
restart would cost, per GPU-hour ``value x (window + restart) / window``: the clearing moves
its GPUs to another bid only for a gain larger than that. What it pays stays at most its
stated value (``charge_limits``), so the premium buys incumbency, never a higher bill.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.money import SECONDS_PER_HOUR, cost_ceil


@dataclass(frozen=True)
class OrderState:
    """What the round opener knows of one live order."""

    gpus: int  # GPUs asked for each round
    min_gpus: int  # all or nothing below (gpus for a rigid gang; 1 = any number helps)
    values: Mapping[str, int]  # tier -> the most it pays, milli-credits per GPU-hour
    gpu_seconds_wanted: int | None  # None: until cancelled
    gpu_seconds: int  # GPU-seconds won so far
    ceiling: int  # total spend it may reach, milli-credits
    committed: int  # spent so far plus escrow still held by its unsettled bids
    restart_seconds: int  # work lost each time it is stopped or moved
    # tier -> GPUs it holds in the window ending as this round starts (empty: not running)
    incumbent: Mapping[str, int] = field(default_factory=dict)
    reserves: Mapping[str, int] = field(default_factory=dict)  # tier -> reserve price


@dataclass(frozen=True)
class OrderBid:
    """The round's bid for an order: the fields of a hand-placed bid, plus the incumbency."""

    quantity: int
    min_quantity: int  # the bid's gang minimum (0 = any quantity is useful)
    limits: dict[str, int]  # tier -> value the clearing sees (restart value on its own tier)
    charge_limits: dict[str, int]  # tier -> the most it pays (its stated value)
    escrow: int  # quantity x highest charge limit x window hours, rounded up


@dataclass(frozen=True)
class NoBid:
    """Why an order makes no bid this round, and whether that ends it."""

    reason: str
    ends: str = ""  # "" (it bids again next round), "done" or "exhausted"


def restart_value(*, value: int, restart_seconds: int, window_seconds: int) -> int:
    """What keeping its GPUs is worth to an incumbent beyond its value, per GPU-hour."""
    return (value * restart_seconds + window_seconds - 1) // window_seconds


def order_bid(state: OrderState, *, window_seconds: int) -> OrderBid | NoBid:
    """The bid ``state`` makes in a round of ``window_seconds``, or why it makes none.

    Size: the GPUs it asks for; an elastic order (min_gpus < gpus) asks no more than the
    work it still wants fills. Price: its values, capped near its ceiling at what the room
    left pays for; once that is below every tier's reserve it makes no bid and is
    exhausted."""
    floor = max(state.min_gpus, 1)
    remaining = None
    if state.gpu_seconds_wanted is not None:
        remaining = state.gpu_seconds_wanted - state.gpu_seconds
        if remaining <= 0:
            return NoBid("it has received the GPU-hours it asked for", ends="done")
    quantity = state.gpus
    if remaining is not None and floor < quantity:
        quantity = max(floor, min(quantity, -(-remaining // window_seconds)))
    charge_limits = {slug: int(v) for slug, v in sorted(state.values.items())}
    room = state.ceiling - state.committed
    # Near its ceiling an order bids what it can still pay: its values capped at what the
    # room covers for the GPUs it asks (an elastic order asks fewer first), and none once
    # that is below every acceptable tier's reserve.
    for size in range(quantity, floor - 1, -1):
        affordable = max(room, 0) * SECONDS_PER_HOUR // (size * window_seconds)
        if size == floor or affordable >= max(charge_limits.values()):
            break
    quantity = size
    if affordable < max(charge_limits.values()):
        capped = {s: min(v, affordable) for s, v in charge_limits.items()}
        capped = {s: v for s, v in capped.items() if v >= max(state.reserves.get(s, 0), 1)}
        if not capped:
            return NoBid(
                f"its spend ceiling leaves {_credits(max(room, 0))} credits, at most "
                f"{_credits(affordable)} per GPU-hour for {quantity} GPU(s): below every "
                "tier's reserve",
                ends="exhausted",
            )
        charge_limits = capped
    top = max(charge_limits.values())
    limits = dict(charge_limits)
    for slug, held in state.incumbent.items():
        if slug in limits and held > 0 and state.restart_seconds > 0:
            limits[slug] += restart_value(
                value=limits[slug],
                restart_seconds=state.restart_seconds,
                window_seconds=window_seconds,
            )
    return OrderBid(
        quantity=quantity,
        min_quantity=state.min_gpus if state.min_gpus > 1 else 0,
        limits=limits,
        charge_limits=charge_limits,
        escrow=cost_ceil(gpus=quantity, price=top, seconds=window_seconds),
    )


def preempted(*, held: Mapping[str, int], won: Mapping[str, int]) -> bool:
    """Whether a round's result stops or moves work that ran in the window before: it held
    GPUs then, and does not keep at least as many on each tier it held."""
    return any(gpus > 0 and won.get(slug, 0) < gpus for slug, gpus in held.items())


def rounds_to_finish(*, remaining_gpu_seconds: int, gpus: int, window_seconds: int) -> int:
    """Windows it must win, each of ``gpus`` GPUs, to receive what it still wants."""
    return max(math.ceil(remaining_gpu_seconds / (gpus * window_seconds)), 0)


def _credits(amount: int) -> str:
    whole, frac = divmod(amount, 1000)
    return f"{whole:,}.{frac:03d}"
