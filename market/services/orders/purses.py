"""What each team may still commit while the round opener places its orders' bids."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from market.models import Bid, Round
from tenants.budgets import budget_usage, hard_cap_walk, tenant_hard_capped
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


def purses_read(tenant_ids: set[int], *, rnd: Round, now: datetime) -> dict[int, Purse]:
    """Each tenant's purse in ``rnd``, its ledger accounts locked first (pk order, as every
    transfer locks them) so what is read stays as read until the holds commit."""
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
    spent = {
        b.pk: budget_usage(budget=b, at=now).spent
        for team in budgets.values()
        for b in team
        if b.mode == Budget.Mode.HARD
    }
    taken = _hard_caps_taken(budgets, spent=spent, rnd=rnd)
    purses = {}
    for tenant_id in tenant_ids:
        safe, capped = [], ""
        for budget in budgets.get(tenant_id, []):
            if budget.mode == Budget.Mode.SAFE:
                usage = budget_usage(budget=budget, at=now)
                safe.append((budget, budget.cap - usage.committed))
            elif budget.mode == Budget.Mode.HARD:
                # What the clearing would admit (tenants.budgets.hard_cap_admit): a bid whose
                # most possible cost fits the room the cap leaves after the team's bids
                # already in the round, so no escrow is held for a bid the cap would leave out.
                safe.append((budget, budget.cap - spent[budget.pk] - taken.get(budget.pk, 0)))
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


def _hard_caps_taken(
    budgets: dict[int, list[Budget]], *, spent: dict[int, int], rnd: Round
) -> dict[int, int]:
    """{hard cap id: what the team's open bids already in ``rnd`` take of it}, walked as the
    clearing walks them (oldest first, one that does not fit takes nothing)."""
    hard = {t: [b for b in bs if b.mode == Budget.Mode.HARD] for t, bs in budgets.items()}
    hard = {t: bs for t, bs in hard.items() if bs}
    if not hard:
        return {}
    commitments: dict[int, list[tuple[int, int | None, int]]] = defaultdict(list)
    for tenant_id, pk, campaign_id, escrow in (
        Bid.objects.filter(round=rnd, status=Bid.Status.OPEN, tenant_id__in=hard)
        .order_by("pk")
        .values_list("tenant_id", "pk", "campaign_id", "escrow")
    ):
        commitments[tenant_id].append((pk, campaign_id, escrow))
    taken: dict[int, int] = {}
    for tenant_id, caps in hard.items():
        if not commitments[tenant_id]:
            continue
        _, admitted = hard_cap_walk(hard=caps, spent=spent, commitments=commitments[tenant_id])
        taken |= {pk: sum(amount for _, amount in under) for pk, under in admitted.items()}
    return taken
