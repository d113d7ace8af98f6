"""Every write in the market goes through these functions (see docs/market.md).

They are keyword-only, typed, run in one transaction each and record their audit event in it.
Refusals raise ``market.errors.MarketError`` with a message a user can act on; a bid that
belongs to another tenant is a 404 (``django.http.Http404``), exactly like a missing one.
"""

from market.services.allocations import (
    allocations_pause,
    allocations_preempt,
    allocations_resume,
)
from market.services.bids import bid_cancel, bid_edit, bid_escrow, bid_place, tenant_bids_cancel
from market.services.orders import (
    order_cancel,
    order_create,
    order_edit,
    order_pause,
    order_resume,
    orders_bid,
)
from market.services.policy import (
    policy_activate,
    policy_active,
    policy_shadow,
    policy_shadow_set,
    policy_version_create,
)
from market.services.round_clearing import round_clear, round_data, solve, tier_price
from market.services.rounds import next_window, round_close, round_finish, round_open_next
from market.services.settlement import round_settle
from market.services.tick import TickReport, round_process, rounds_tick
from market.services.tiers import tier_capacity_set, tier_create, tier_update
from market.services.void import round_fail, round_void

__all__ = [
    "TickReport",
    "allocations_pause",
    "allocations_preempt",
    "allocations_resume",
    "bid_cancel",
    "bid_edit",
    "bid_escrow",
    "bid_place",
    "next_window",
    "order_cancel",
    "order_create",
    "order_edit",
    "order_pause",
    "order_resume",
    "orders_bid",
    "policy_activate",
    "policy_active",
    "policy_shadow",
    "policy_shadow_set",
    "policy_version_create",
    "round_clear",
    "round_close",
    "round_data",
    "round_fail",
    "round_finish",
    "round_open_next",
    "round_process",
    "round_settle",
    "round_void",
    "rounds_tick",
    "solve",
    "tenant_bids_cancel",
    "tier_capacity_set",
    "tier_create",
    "tier_price",
    "tier_update",
]
