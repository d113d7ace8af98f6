"""What an order tells its team: why it ended, that it may miss its deadline, its progress."""

from __future__ import annotations

from datetime import datetime

from market.foresight import foresee
from market.models import Order
from market.selectors import FORESIGHT_ROUNDS, price_history
from tenants.ledger import credits
from tenants.models import Notification


def deadlines_check(
    orders: list[Order], *, values: dict[int, dict[str, int]], window: int, now: datetime
) -> None:
    """A notice (once a day per order) for each order with a deadline that the recent rounds'
    prices say it will miss at its values: the value it would need, or that no price will
    do (market/foresight.py)."""
    if not orders:
        return
    prices = [row["prices"] for row in price_history(limit=FORESIGHT_ROUNDS)]
    notices = []
    for order in orders:
        mine = values.get(order.pk) or {}
        if not mine or order.gpu_seconds_wanted is None:
            continue
        seen = foresee(
            prices=prices,
            values=mine,
            gpus=order.gpus,
            remaining_gpu_seconds=max(order.gpu_seconds_wanted - order.gpu_seconds, 0),
            window_seconds=window,
            now=now,
            deadline=order.deadline,
        )
        if not seen.windows_needed or (seen.needed_value is None and not seen.needed_reason):
            continue
        windows_left = int((order.deadline - now).total_seconds() // window)
        if not prices and windows_left >= seen.windows_needed:
            continue  # no price history to judge by, and time enough
        if seen.needed_value is not None:
            if seen.needed_value <= max(mine.values()):
                continue
            advice = (
                f"bid {credits(seen.needed_value)} credits/GPU-h to finish by "
                f"{order.deadline:%a %d %b %H:%M} UTC (it offers at most "
                f"{credits(max(mine.values()))})"
            )
        else:
            advice = seen.needed_reason
        notices.append(
            order_notice(
                order,
                "order_deadline_at_risk",
                f"may miss its deadline: {advice}",
                level=Notification.Level.WARNING,
                key=f"order-deadline-risk:{order.pk}:{now:%Y-%m-%d}",
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


def _hours(gpu_seconds: int | None) -> str:
    return "until cancelled" if gpu_seconds is None else f"{gpu_seconds / 3600:,.2f}"


def done_reason(order: Order) -> str:
    return f"received {_hours(order.gpu_seconds)} of {_hours(order.gpu_seconds_wanted)} GPU-hours"


def deadline_reason(order: Order) -> str:
    wanted = _hours(order.gpu_seconds_wanted)
    return (
        f"its deadline {order.deadline:%Y-%m-%d %H:%M} UTC passed with "
        f"{_hours(order.gpu_seconds)} of {wanted} GPU-hours received"
    )


_ENDED_TEXT = {
    Order.Status.DONE: ("order_finished", Notification.Level.INFO, "finished"),
    Order.Status.EXHAUSTED: ("order_budget_exhausted", Notification.Level.WARNING, "stopped"),
    Order.Status.EXPIRED: ("order_deadline_passed", Notification.Level.WARNING, "stopped"),
}


def ended_notify(orders: list[Order]) -> None:
    notices = []
    for order in orders:
        kind, level, verb = _ENDED_TEXT[order.status]
        notices.append(
            Notification(
                tenant_id=order.tenant_id,
                level=level,
                kind=kind,
                message=f"Order {order.pk} ({order.name}) {verb}: {order.status_reason}."[:500],
                dedupe_key=f"order-end:{order.pk}",
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


def gpus_text(won: dict[str, int]) -> str:
    return ", ".join(f"{gpus} x {slug}" for slug, gpus in sorted(won.items()))


def order_notice(
    order: Order,
    kind: str,
    text: str,
    *,
    level: str = Notification.Level.INFO,
    key: str | None = None,
) -> Notification:
    return Notification(
        tenant_id=order.tenant_id,
        level=level,
        kind=kind,
        message=f"Order {order.pk} ({order.name}) {text}"[:500],
        dedupe_key=key or f"{kind.replace('_', '-')}:{order.pk}",
    )
