"""What each team may still commit while the round opener places its orders' bids."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from tenants.budgets import budget_usage, tenant_hard_capped
from tenants.ledger import credits
from tenants.models import Account, Budget


class Purse:
    """What one tenant may still commit in this opening: its available balance and the room
    under each of its safe budgets and hard caps, drawn down as its orders' bids are
    admitted."""

    def __init__(self, *, available: int, budgets: list[tuple[Budget, int]], capped: str) -> None:
        self.available = available
        self.budgets = budgets  # (safe budget or hard cap, room left)
        self.capped = capped  # why a hard cap stops every bid, or ""

    def admit(self, amount: int, campaign_id: int | None) -> str:
        if self.capped:
            return self.capped
        if amount > self.available:
            return (
                f"the team's available balance is {credits(self.available)} credits and this "
                f"round's bid needs {credits(amount)}"
            )
        applicable = [
            (i, b) for i, (b, _) in enumerate(self.budgets) if b.campaign_id in (None, campaign_id)
        ]
        for i, budget in applicable:
            if amount > self.budgets[i][1]:
                scope = (
                    f"campaign {budget.campaign.name!r}" if budget.campaign_id else budget.window
                )
                kind = "hard cap" if budget.mode == Budget.Mode.HARD else "budget"
                return (
                    f"the {scope} {kind} of {credits(budget.cap)} credits has "
                    f"{credits(max(self.budgets[i][1], 0))} left and this round's bid needs "
                    f"{credits(amount)}"
                )
        self.available -= amount
        for i, _ in applicable:
            self.budgets[i] = (self.budgets[i][0], self.budgets[i][1] - amount)
        return ""


def purses_read(tenant_ids: set[int], *, now: datetime) -> dict[int, Purse]:
    """Each tenant's purse, its ledger accounts locked first (pk order, as every transfer
    locks them) so what is read stays as read until the holds commit."""
    accounts = list(
        Account.objects.select_for_update()
        .filter(tenant_id__in=tenant_ids, kind__in=Account.TENANT_KINDS)
        .order_by("pk")
    )
    available = {a.tenant_id: a.balance for a in accounts if a.kind == Account.Kind.AVAILABLE}
    budgets: dict[int, list[Budget]] = defaultdict(list)
    for budget in (
        Budget.objects.filter(tenant_id__in=tenant_ids, active=True)
        .select_related("campaign", "tenant")
        .order_by("pk")
    ):
        if budget.campaign_id is None or budget.campaign.starts_at <= now < budget.campaign.ends_at:
            budgets[budget.tenant_id].append(budget)
    purses = {}
    for tenant_id in tenant_ids:
        safe, capped = [], ""
        for budget in budgets.get(tenant_id, []):
            if budget.mode == Budget.Mode.SAFE:
                usage = budget_usage(budget=budget, at=now)
                safe.append((budget, budget.cap - usage.committed))
            elif budget.mode == Budget.Mode.HARD:
                # What the clearing would admit (tenants.budgets.hard_cap_admit): a bid whose
                # most possible cost fits the room the cap leaves, so no escrow is held for
                # a bid the cap would leave out.
                safe.append((budget, budget.cap - budget_usage(budget=budget, at=now).spent))
        if any(b.mode == Budget.Mode.HARD for b in budgets.get(tenant_id, [])):
            hard = tenant_hard_capped(tenant=budgets[tenant_id][0].tenant, at=now)
            if hard is not None:
                scope = (
                    hard.campaign.name if hard.campaign_id else hard.get_window_display().lower()
                )
                capped = (
                    f"paused: the team reached its {scope} hard cap of {credits(hard.cap)} "
                    "credits; it bids again when the window rolls over or the cap is raised"
                )
        purses[tenant_id] = Purse(
            available=available.get(tenant_id, 0), budgets=safe, capped=capped
        )
    return purses
