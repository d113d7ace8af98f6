"""Budgets: caps on charges over a window. One question for the rest of the platform:
"may this tenant commit X more credits now?" (``budget_check``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

import audit.services as audit
from tenants.errors import TenantError
from tenants.ledger import amount_validate, credits
from tenants.models import Budget, Campaign, Notification, Tenant, Transfer

ALERT_THRESHOLDS = (50, 80, 100)
# Bids a hard cap's reason names as having taken the room (a reason is at most 300 chars).
NAMED_MOST = 3


def window_bounds(*, budget: Budget, at: datetime) -> tuple[datetime, datetime]:
    """The [start, end) of the budget's window containing ``at`` (calendar windows in UTC)."""
    if budget.window == Budget.Window.CAMPAIGN:
        return budget.campaign.starts_at, budget.campaign.ends_at
    at = at.astimezone(UTC)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if budget.window == Budget.Window.DAY:
        return day, day + timedelta(days=1)
    if budget.window == Budget.Window.WEEK:
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


@dataclass(frozen=True)
class BudgetUsage:
    budget: Budget
    window_start: datetime
    window_end: datetime
    spent: int  # charges minus refunds in the window, milli-credits
    held: int  # escrow currently held against it, milli-credits

    @property
    def committed(self) -> int:
        return self.spent + self.held

    @property
    def remaining(self) -> int:
        return max(self.budget.cap - self.committed, 0)

    @property
    def spent_pct(self) -> float:
        return 100.0 * self.spent / self.budget.cap if self.budget.cap else 100.0

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.budget.cap


def _tenant_transfers(budget: Budget) -> QuerySet[Transfer]:
    qs = Transfer.objects.filter(tenant_id=budget.tenant_id)
    if budget.campaign_id is not None:
        qs = qs.filter(campaign_id=budget.campaign_id)
    return qs


def _sum(where: Q) -> Sum:
    return Sum("amount", filter=where, default=0)


def budget_usage(*, budget: Budget, at: datetime | None = None) -> BudgetUsage:
    at = at or timezone.now()
    start, end = window_bounds(budget=budget, at=at)
    in_window = Q(created_at__gte=start, created_at__lt=end)
    Kind = Transfer.Kind
    # One scan of the tenant's transfers for all four sums.
    sums = _tenant_transfers(budget).aggregate(
        charged=_sum(in_window & Q(kind=Kind.CHARGE)),
        refunded=_sum(in_window & Q(kind=Kind.REFUND)),
        held=_sum(Q(kind=Kind.HOLD)),
        freed=_sum(Q(kind__in=[Kind.RELEASE, Kind.CHARGE])),
    )
    spent = sums["charged"] - sums["refunded"]
    # Escrow still held (holds not yet released or charged), whenever it was placed.
    held = sums["held"] - sums["freed"]
    return BudgetUsage(
        budget=budget, window_start=start, window_end=end, spent=spent, held=max(held, 0)
    )


def budgets_applicable(*, tenant: Tenant, campaign: Campaign | None, at: datetime) -> list[Budget]:
    scope = Q(campaign__isnull=True)
    if campaign is not None:
        scope |= Q(campaign=campaign)
    budgets = Budget.objects.filter(scope, tenant=tenant, active=True).select_related("campaign")
    return [
        b
        for b in budgets
        if b.campaign_id is None or b.campaign.starts_at <= at < b.campaign.ends_at
    ]


@dataclass(frozen=True)
class BudgetDecision:
    allowed: bool
    reason: str = ""


def budget_check(
    *, tenant: Tenant, amount: int, campaign: Campaign | None = None, at: datetime | None = None
) -> BudgetDecision:
    """May ``tenant`` commit ``amount`` more milli-credits now?

    ``safe`` budgets refuse a commitment that could break the cap (spent + held + amount);
    ``hard`` budgets refuse once the cap is reached; ``soft`` budgets never refuse.
    """
    amount_validate(amount)
    at = at or timezone.now()
    if campaign is not None and not (campaign.starts_at <= at < campaign.ends_at):
        return BudgetDecision(False, f"campaign {campaign.name!r} is not running now")
    for budget in budgets_applicable(tenant=tenant, campaign=campaign, at=at):
        usage = budget_usage(budget=budget, at=at)
        label = (
            f"campaign {budget.campaign.name!r}"
            if budget.campaign_id
            else {"day": "daily", "week": "weekly", "month": "monthly"}[budget.window]
        )
        if budget.mode == Budget.Mode.SAFE and usage.committed + amount > budget.cap:
            return BudgetDecision(
                False,
                f"the {label} budget would be exceeded: cap {credits(budget.cap)}, already "
                f"committed {credits(usage.committed)}, this needs {credits(amount)} "
                f"(at most {credits(usage.remaining)} more fits)",
            )
        if budget.mode == Budget.Mode.HARD and usage.exhausted:
            return BudgetDecision(
                False,
                f"the {label} hard cap of {credits(budget.cap)} is reached "
                f"(spent {credits(usage.spent)}); bidding resumes when the window rolls over "
                "or an admin raises the cap",
            )
    return BudgetDecision(True)


def _label(budget: Budget) -> str:
    if budget.campaign_id:
        return f"campaign {budget.campaign.name!r} hard cap"
    return {"day": "daily", "week": "weekly", "month": "monthly"}[budget.window] + " hard cap"


def hard_cap_admit(
    *, tenant: Tenant, commitments: list[tuple[int, int | None, int]], at: datetime | None = None
) -> dict[int, str]:
    """Which of ``commitments`` [(id, campaign id or None, most it can cost)] fit under the
    tenant's hard caps, in the team's order of priority (the order given); returns {id: why}
    for those that do not.

    A commitment fits when the most it can cost is at or below the room still left under
    every hard cap that applies to it (the tenant's own, and its campaign's), once the ones
    admitted before it are counted. A charge never exceeds that most, so the team's spend
    can reach a hard cap but never pass it. One that does not fit is skipped and the next is
    tried: the admitted set is the best by the team's own order (no earlier commitment is
    given up for a later one). The reason names the cap, what is spent, the earlier
    commitments that took the room and what this one may cost.
    """
    at = at or timezone.now()
    hard = [
        b
        for b in Budget.objects.filter(tenant=tenant, active=True, mode=Budget.Mode.HARD)
        .select_related("campaign")
        .order_by("pk")
        if b.campaign_id is None or b.campaign.starts_at <= at < b.campaign.ends_at
    ]
    if not hard:
        return {}
    spent = {b.pk: budget_usage(budget=b, at=at).spent for b in hard}
    left_out, _ = hard_cap_walk(hard=hard, spent=spent, commitments=commitments)
    return {
        key: _left_out_why(short, spent[short.pk], before, amount)
        for key, (short, amount, before) in left_out.items()
    }


def hard_cap_walk(
    *,
    hard: list[Budget],
    spent: dict[int, int],
    commitments: list[tuple[int, int | None, int]],
) -> tuple[dict[int, tuple[Budget, int, list[tuple[int, int]]]], dict[int, list[tuple[int, int]]]]:
    """``hard_cap_admit``'s walk over ``commitments`` in order, for callers that hold the caps
    and their spend already: ({id: (the first cap it does not fit, its amount, the admitted
    commitments before it under that cap)} for those left out, {cap id: [(id, amount)] of
    every commitment admitted under it})."""
    taken: dict[int, list[tuple[int, int]]] = {b.pk: [] for b in hard}
    left_out: dict[int, tuple[Budget, int, list[tuple[int, int]]]] = {}
    for key, campaign_id, amount in commitments:
        applicable = [b for b in hard if b.campaign_id in (None, campaign_id)]
        short = next((b for b in applicable if amount > _room(b, spent, taken)), None)
        if short is not None:
            left_out[key] = (short, amount, list(taken[short.pk]))
            continue
        for b in applicable:
            taken[b.pk].append((key, amount))
    return left_out, taken


def _room(budget: Budget, spent: dict[int, int], taken: dict[int, list[tuple[int, int]]]) -> int:
    return budget.cap - spent[budget.pk] - sum(amount for _, amount in taken[budget.pk])


def _left_out_why(budget: Budget, spent: int, taken: list[tuple[int, int]], amount: int) -> str:
    room = max(budget.cap - spent - sum(a for _, a in taken), 0)
    why = f"the {_label(budget)} of {credits(budget.cap)} credits"
    why += f" has {credits(max(budget.cap - spent, 0))} left after {credits(spent)} spent"
    if taken:
        named = ", ".join(f"bid {key} (up to {credits(a)})" for key, a in taken[:NAMED_MOST])
        if len(taken) > NAMED_MOST:
            named += f" and {len(taken) - NAMED_MOST} more"
        why += (
            f"; the team's {named} came first and "
            f"{'holds' if len(taken) == 1 else 'hold'} {credits(sum(a for _, a in taken))} "
            f"of it, leaving {credits(room)}"
        )
    return why + f"; this bid may cost up to {credits(amount)}, more than {credits(room)}"


def hard_cap_room(
    *, tenant: Tenant, campaign_id: int | None, at: datetime | None = None
) -> int | None:
    """Milli-credits left under the tightest hard cap that applies (None: no hard cap)."""
    at = at or timezone.now()
    rooms = [
        b.cap - budget_usage(budget=b, at=at).spent
        for b in Budget.objects.filter(
            tenant=tenant, active=True, mode=Budget.Mode.HARD
        ).select_related("campaign")
        if b.campaign_id in (None, campaign_id)
        and (b.campaign_id is None or b.campaign.starts_at <= at < b.campaign.ends_at)
    ]
    return min(rooms) if rooms else None


def tenant_hard_capped(*, tenant: Tenant, at: datetime | None = None) -> Budget | None:
    """The hard budget this tenant has reached now, if any (the enforcement loop pauses it)."""
    at = at or timezone.now()
    for budget in budgets_applicable(tenant=tenant, campaign=None, at=at):
        if budget.mode == Budget.Mode.HARD and budget_usage(budget=budget, at=at).exhausted:
            return budget
    # Campaign hard caps apply to that campaign's work only; the caller checks those itself.
    return None


@transaction.atomic
def budget_set(
    *,
    tenant: Tenant,
    window: str,
    mode: str,
    cap: int,
    actor: AbstractBaseUser | None,
    campaign: Campaign | None = None,
) -> Budget:
    """Create or change the tenant's budget for a window (one active budget per window/campaign)."""
    if window not in Budget.Window.values:
        raise TenantError(f"window must be one of {Budget.Window.values}, got {window!r}")
    if mode not in Budget.Mode.values:
        raise TenantError(f"mode must be one of {Budget.Mode.values}, got {mode!r}")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise TenantError(f"cap must be a whole number of milli-credits >= 0, got {cap!r}")
    if (window == Budget.Window.CAMPAIGN) != (campaign is not None):
        raise TenantError("a campaign budget needs a campaign, and only campaign budgets take one")
    if campaign is not None and campaign.tenant_id != tenant.pk:
        raise TenantError(f"campaign {campaign.name!r} does not belong to {tenant.slug!r}")
    existing = (
        Budget.objects.select_for_update()
        .filter(tenant=tenant, window=window, campaign=campaign, active=True)
        .first()
    )
    platform = bool(actor is not None and actor.is_staff)
    before = None
    if existing is not None:
        if existing.set_by_platform and not platform and _loosens(existing, mode=mode, cap=cap):
            raise TenantError(
                f"cap: the {existing.get_window_display().lower()} cap of "
                f"{credits(existing.cap)} credits ({existing.mode}) was set by a platform admin; "
                "the team may lower it or make it stricter, and only an admin loosens it"
            )
        before = {"mode": existing.mode, "cap": existing.cap}
        existing.mode, existing.cap = mode, cap
        existing.set_by_platform = existing.set_by_platform or platform
        existing.save(update_fields=["mode", "cap", "set_by_platform"])
        budget = existing
    else:
        budget = Budget.objects.create(
            tenant=tenant,
            window=window,
            mode=mode,
            cap=cap,
            campaign=campaign,
            set_by_platform=platform,
        )
    audit.record(
        actor=actor,
        action="budget.set",
        target=budget,
        tenant=tenant,
        before=before,
        after={
            "window": window,
            "mode": mode,
            "cap": cap,
            "campaign": campaign.pk if campaign else None,
            "set_by_platform": budget.set_by_platform,
        },
    )
    _alerts_clear_stale(budget=budget, at=timezone.now())
    return budget


def _loosens(budget: Budget, *, mode: str, cap: int) -> bool:
    """Whether (mode, cap) lets more through than ``budget``: a higher cap, or a soft cap (an
    alert only) in place of one that refuses bids or pauses work."""
    return cap > budget.cap or (mode == Budget.Mode.SOFT and budget.mode != Budget.Mode.SOFT)


def _alert_key(*, budget: Budget, window_start: datetime, threshold: int) -> str:
    # The cap is part of the key: crossing a threshold of a changed cap is a new alert.
    return f"budget:{budget.pk}:{window_start.date().isoformat()}:{budget.cap}:{threshold}"


def _alerts_clear_stale(*, budget: Budget, at: datetime) -> int:
    """Mark read the budget's unread alerts that no longer hold after its cap changed: a raised
    hard cap clears "work is paused" at once, not only when some allocation resumes."""
    usage = budget_usage(budget=budget, at=at)
    stale = [
        n.pk
        for n in Notification.objects.filter(
            kind="budget", dedupe_key__startswith=f"budget:{budget.pk}:", read_at__isnull=True
        )
        if int(n.dedupe_key.rsplit(":", 1)[1]) > usage.spent_pct
    ]
    cleared = Notification.objects.filter(pk__in=stale).update(read_at=at)
    if tenant_hard_capped(tenant=budget.tenant, at=at) is None:
        # "Work paused" holds only while a hard cap does; the allocations it paused may have
        # ended since, and then no resume would ever clear it.
        cleared += Notification.objects.filter(
            tenant_id=budget.tenant_id, kind="work_paused", read_at__isnull=True
        ).update(read_at=at)
    return cleared


@transaction.atomic
def campaign_create(
    *,
    tenant: Tenant,
    name: str,
    starts_at: datetime,
    ends_at: datetime,
    actor: AbstractBaseUser | None,
) -> Campaign:
    name = (name or "").strip()
    if not name:
        raise TenantError("a campaign needs a name")
    if timezone.is_naive(starts_at) or timezone.is_naive(ends_at):
        raise TenantError("campaign start and end must be timezone-aware")
    if ends_at <= starts_at:
        raise TenantError("a campaign must end after it starts")
    if Campaign.objects.filter(tenant=tenant, name=name).exists():
        raise TenantError(f"campaign {name!r} already exists in {tenant.slug}")
    campaign = Campaign.objects.create(
        tenant=tenant, name=name, starts_at=starts_at, ends_at=ends_at
    )
    audit.record(
        actor=actor,
        action="campaign.create",
        target=campaign,
        tenant=tenant,
        after={"name": name, "starts_at": starts_at.isoformat(), "ends_at": ends_at.isoformat()},
    )
    return campaign


def budget_alerts_raise(*, tenant: Tenant, at: datetime | None = None) -> list[Notification]:
    """Store one notification per budget, window and crossed threshold (50/80/100 %).

    Spend (or a lowered cap) that crosses several thresholds at once is one alert, for the
    highest. Idempotent: the dedupe key makes a second call in the same window a no-op.
    """
    at = at or timezone.now()
    created: list[Notification] = []
    for budget in budgets_applicable(tenant=tenant, campaign=None, at=at) + list(
        Budget.objects.filter(tenant=tenant, active=True, campaign__isnull=False)
        .select_related("campaign")
        .filter(campaign__starts_at__lte=at, campaign__ends_at__gt=at)
    ):
        usage = budget_usage(budget=budget, at=at)
        crossed = [t for t in ALERT_THRESHOLDS if usage.spent_pct >= t]
        for threshold in crossed[-1:]:
            key = _alert_key(budget=budget, window_start=usage.window_start, threshold=threshold)
            with transaction.atomic():
                notification, made = Notification.objects.get_or_create(
                    dedupe_key=key,
                    defaults={
                        "tenant": tenant,
                        "level": Notification.Level.CRITICAL
                        if threshold == 100
                        else Notification.Level.WARNING,
                        "kind": "budget",
                        "message": (
                            f"{budget.get_window_display()} budget passed {threshold}% "
                            f"({usage.spent_pct:.0f}% now): "
                            f"spent {credits(usage.spent)} of {credits(budget.cap)}"
                            + (
                                " (hard cap: work is paused)"
                                if threshold == 100 and budget.mode == Budget.Mode.HARD
                                else ""
                            )
                        ),
                    },
                )
                if made:
                    audit.record(
                        actor="system",
                        action="budget.alert",
                        target=notification,
                        tenant=tenant,
                        after={"budget": budget.pk, "threshold": threshold, "spent": usage.spent},
                    )
                    created.append(notification)
    return created
