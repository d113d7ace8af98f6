"""An order's terms, checked field by field, and how the audit trail records them."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.money import cost_ceil
from market.errors import MarketError
from market.models import Order, Tier
from market.placement.inventory import tier_gpus
from market.services._common import MAX_GPUS, MAX_PRICE, whole
from market.services.bids import tiers_on_offer
from market.services.policy import policy_active
from tenants.ledger import credits

MAX_RESTART_SECONDS = 24 * 3600


MAX_CEILING = 10**15  # the ledger's largest amount


_SLURM_JOB = re.compile(r"^\d+(?:[_+]\d+)?$")


@dataclass(frozen=True)
class Terms:
    name: str
    values: dict[str, int]
    tiers: dict[str, Tier]
    gpus: int
    min_gpus: int
    gpu_seconds_wanted: int | None
    ceiling: int
    deadline: datetime | None
    restart_seconds: int


def _largest_gang(slug: str, tier: Tier) -> tuple[int, str] | None:
    """The most GPUs one node of the tier has (a gang runs on one node), and where; None
    when nothing is known of the tier's nodes yet (none reports GPUs and none are offered:
    a node may still be coming up)."""
    per_node: dict[str, int] = defaultdict(int)
    for gpu in tier_gpus(slug):
        per_node[gpu.node] += 1
    if not per_node:
        if not tier.offered:
            return None
        return tier.offered, f"tier {slug} offers {tier.offered}"
    node, most = max(sorted(per_node.items()), key=lambda kv: kv[1])
    return most, f"{node} ({slug}) has {most}"


def terms_check(
    *,
    name: Any,
    values: Any,
    gpus: Any,
    min_gpus: Any,
    gpu_seconds_wanted: Any,
    ceiling: Any,
    deadline: Any,
    restart_seconds: Any,
    now: datetime,
) -> Terms:
    """Every field checked, each refusal naming the field and what to change."""
    name = _name_check(name)
    gpus = whole(gpus, field="gpus", minimum=1, maximum=MAX_GPUS)
    min_gpus = whole(
        gpus if min_gpus is None else min_gpus, field="min_gpus", minimum=1, maximum=gpus
    )
    clean, tiers = _values_check(values)
    _gang_fits_check(min_gpus, values=clean, tiers=tiers)
    if gpu_seconds_wanted is not None:
        gpu_seconds_wanted = whole(
            gpu_seconds_wanted, field="gpu_hours (in GPU-seconds)", minimum=1, maximum=10**12
        )
    ceiling = whole(ceiling, field="ceiling (milli-credits)", minimum=1, maximum=MAX_CEILING)
    _ceiling_and_values_check(ceiling, min_gpus=min_gpus, values=clean)
    _deadline_check(deadline, now=now)
    restart_seconds = whole(
        restart_seconds, field="restart_seconds", minimum=0, maximum=MAX_RESTART_SECONDS
    )
    return Terms(
        name=name,
        values=clean,
        tiers=tiers,
        gpus=gpus,
        min_gpus=min_gpus,
        gpu_seconds_wanted=gpu_seconds_wanted,
        ceiling=ceiling,
        deadline=deadline,
        restart_seconds=restart_seconds,
    )


def _name_check(name: Any) -> str:
    name = str(name or "").strip()
    if not name:
        raise MarketError("name: give the order a name, e.g. the run it drives")
    if len(name) > 120:
        raise MarketError("name: at most 120 characters")
    return name


def _values_check(values: Any) -> tuple[dict[str, int], dict[str, Tier]]:
    """{tier slug: value} with every tier on offer and every value a whole price, sorted by
    slug, and the tiers by slug."""
    if not isinstance(values, dict) or not values:
        raise MarketError("values: give the most you pay per GPU-hour on at least one tier")
    tiers = tiers_on_offer(list(values), field="values", then="value another tier")
    clean = {
        slug: whole(
            price,
            field=f"values: the value for {slug} (milli-credits per GPU-hour)",
            minimum=1,
            maximum=MAX_PRICE,
        )
        for slug, price in sorted(values.items())
    }
    return clean, tiers


def _gang_fits_check(min_gpus: int, *, values: dict[str, int], tiers: dict[str, Tier]) -> None:
    """Refuse a gang larger than the largest node of every tier it values (as far as the
    tiers' nodes are known)."""
    if min_gpus <= 1:
        return
    sizes = {slug: _largest_gang(slug, tiers[slug]) for slug in values}
    known = [size for size in sizes.values() if size is not None]
    if len(known) == len(sizes) and all(min_gpus > most for most, _ in known):
        where = "; ".join(text for _, text in known)
        raise MarketError(
            f"min_gpus: a gang of {min_gpus} GPUs runs on one node and no node is that "
            f"large ({where}); lower min_gpus or split the work"
        )


def _ceiling_and_values_check(ceiling: int, *, min_gpus: int, values: dict[str, int]) -> None:
    """Under the active policy: the ceiling pays for one window of ``min_gpus`` at the
    cheapest reserve and at the highest value, and some value reaches its tier's reserve."""
    policy = policy_active()
    seconds = policy.round_minutes * 60
    cheapest = min(
        cost_ceil(gpus=min_gpus, price=policy.reserve_for(s), seconds=seconds) for s in values
    )
    if ceiling < cheapest:
        raise MarketError(
            f"ceiling: {credits(ceiling)} credits is below one window's reserve for "
            f"{min_gpus} GPU(s) ({credits(cheapest)} credits); raise the ceiling"
        )
    one_window = cost_ceil(gpus=min_gpus, price=max(values.values()), seconds=seconds)
    if ceiling < one_window:
        raise MarketError(
            f"ceiling: {credits(ceiling)} credits does not cover one window of {min_gpus} "
            f"GPU(s) at your highest value ({credits(one_window)} credits); raise the ceiling "
            "or lower the values"
        )
    below = [s for s, v in values.items() if v < policy.reserve_for(s)]
    if len(below) == len(values):
        reserves = ", ".join(f"{s} {credits(policy.reserve_for(s))}" for s in below)
        raise MarketError(
            f"values: every value is below its tier's reserve price ({reserves} credits per "
            "GPU-hour); the order could never win"
        )


def _deadline_check(deadline: Any, *, now: datetime) -> None:
    if deadline is None:
        return
    if not isinstance(deadline, datetime) or deadline.tzinfo is None:
        raise MarketError("deadline: a date and time with its time zone")
    if deadline <= now:
        raise MarketError(f"deadline: {deadline:%Y-%m-%d %H:%M} UTC is in the past")


def order_snapshot(order: Order, values: dict[str, int]) -> dict[str, Any]:
    return {
        "name": order.name,
        "values": values,
        "gpus": order.gpus,
        "min_gpus": order.min_gpus,
        "gpu_seconds_wanted": order.gpu_seconds_wanted,
        "ceiling": order.ceiling,
        "deadline": order.deadline.isoformat() if order.deadline else None,
        "restart_seconds": order.restart_seconds,
        "campaign": order.campaign_id,
        "status": order.status,
    }


def order_values(order: Order) -> dict[str, int]:
    return dict(order.limits.order_by("tier__slug").values_list("tier__slug", "price"))
