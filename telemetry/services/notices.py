"""What a team is told when the enforcement loop changes its allocations: work paused for a
hard cap (and which charges came back), work resumed (the paused notice is cleared: it no
longer holds), and a window that ended with work still running."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from market.models import Allocation
from tenants.models import Notification

Level = Notification.Level


def _ids(allocations: Iterable[Allocation]) -> str:
    return ", ".join(f"#{a.pk}" for a in allocations)


def work_paused_notify(*, paused: list[Allocation], reason: str, now: datetime) -> None:
    """One warning per team whose allocations the loop paused now."""
    by_tenant: dict[int, list[Allocation]] = {}
    for allocation in paused:
        by_tenant.setdefault(allocation.tenant_id, []).append(allocation)
    notices = []
    for tenant_id, mine in by_tenant.items():
        refunded = [a for a in mine if a.cap_refund]
        message = f"Work paused on allocation(s) {_ids(mine)}: {reason}."
        if refunded:
            message += f" No work had run on {_ids(refunded)}: their charge came back."
        notices.append(
            Notification(
                tenant_id=tenant_id,
                level=Level.WARNING,
                kind="work_paused",
                message=message[:500],
                dedupe_key=f"work-paused:{tenant_id}:{mine[0].pk}:{now:%Y%m%d%H%M%S%f}"[:120],
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


def work_resumed_notify(*, resumed: list[Allocation], now: datetime) -> None:
    """Clear the teams' "work paused" notices (they no longer hold) and say it resumed."""
    tenant_ids = sorted({a.tenant_id for a in resumed})
    Notification.objects.filter(
        tenant_id__in=tenant_ids, kind="work_paused", read_at__isnull=True
    ).update(read_at=now)
    Notification.objects.bulk_create(
        [
            Notification(
                tenant_id=tenant_id,
                level=Level.INFO,
                kind="work_resumed",
                message=(
                    f"Work resumed on allocation(s) "
                    f"{_ids(a for a in resumed if a.tenant_id == tenant_id)}: the hard spend "
                    "cap no longer applies."
                )[:500],
            )
            for tenant_id in tenant_ids
        ]
    )


def window_ended_notify(
    *, ended: list[Allocation], grace_seconds: int, suspended: frozenset[int] = frozenset()
) -> None:
    """One notice per team and round whose window ended with work still running on some of
    the team's allocations (a later tick of the same round adds to it, it does not repeat).

    A window's end is the normal end of an allocation, not a preemption: the notice says what
    became of the work. ``suspended``: the allocations whose standing order's work is
    suspended (checkpoint signal, then stopped with its GPUs released), not killed."""
    groups: dict[tuple[int, int], list[Allocation]] = {}
    for allocation in ended:
        groups.setdefault((allocation.tenant_id, allocation.round_id), []).append(allocation)
    for (tenant_id, round_id), mine in groups.items():
        stopped = [a for a in mine if a.pk not in suspended]
        held = [a for a in mine if a.pk in suspended]
        parts = []
        if stopped:
            parts.append(
                f"work still running on allocation(s) {_ids(stopped)} was stopped (SIGTERM, "
                f"then SIGKILL after {grace_seconds} s to checkpoint)."
            )
        if held:
            orders = ", ".join(sorted({str(a.bid.order_id) for a in held}, key=int))
            parts.append(
                f"the work of order(s) {orders} on allocation(s) {_ids(held)} gets the "
                f"checkpoint signal and is suspended after {grace_seconds} s (not killed); it "
                "resumes when the order wins again."
            )
        news = " ".join(p[0].upper() + p[1:] for p in parts)
        key = f"window-ended:{tenant_id}:{round_id}"
        existing = Notification.objects.filter(dedupe_key=key).first()
        if existing is not None:
            existing.message = f"{existing.message} {news}"[:500]
            existing.save(update_fields=["message"])
            continue
        Notification.objects.bulk_create(
            [
                Notification(
                    tenant_id=tenant_id,
                    level=Level.INFO,
                    kind="allocation_ended",
                    message=(
                        f"Round {round_id}'s window ended at {mine[0].ends_at:%Y-%m-%d %H:%M} "
                        f"UTC. {news}"
                    )[:500],
                    dedupe_key=key,
                )
            ],
            ignore_conflicts=True,
        )
