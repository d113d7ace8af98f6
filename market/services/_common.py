"""Small helpers shared by the market services: money arithmetic, argument checks and round
notices, and the round and bid locks every service takes the same way."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import OperationalError, connection
from django.utils import timezone

from market.errors import MarketError, RoundBusy
from market.models import Bid, Round
from tenants.models import Campaign, Notification, Tenant

# Milli-credits per GPU-hour. A million credits per GPU-hour is far above any real price and
# keeps quantity x price x seconds well inside 64-bit integers.
MAX_PRICE = 10**9
MAX_GPUS = 100_000


def now_or(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if timezone.is_naive(now):
        raise MarketError("times must be timezone-aware")
    return now


def whole(value: Any, *, field: str, minimum: int, maximum: int) -> int:
    """An integer argument in [minimum, maximum]; a float, string or bool is refused, not cast,
    because 2.5 GPUs or a price of "10" is a caller's unit mistake."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MarketError(f"{field} must be a whole number, got {value!r}")
    if value < minimum:
        raise MarketError(f"{field} must be at least {minimum}, got {value}")
    if value > maximum:
        raise MarketError(f"{field} must be at most {maximum}, got {value}")
    return value


def round_notices_send(
    *,
    rnd: Round,
    kind: str,
    admin_level: str,
    admin_message: str,
    tenant_messages: Mapping[Tenant, str],
) -> None:
    """One notice of ``kind`` for the admins and one (a warning) for each tenant given.

    Dedupe keys are ``<kind with hyphens>:<round>`` and ``...:<tenant>``, so a service retried
    after a crash sends nothing twice. Messages are cut to the 500 characters a notice holds.
    """
    key = f"{kind.replace('_', '-')}:{rnd.pk}"
    notices = [
        Notification(
            tenant=None,
            level=admin_level,
            kind=kind,
            message=admin_message[:500],
            dedupe_key=key,
        )
    ]
    notices += [
        Notification(
            tenant=tenant,
            level=Notification.Level.WARNING,
            kind=kind,
            message=message[:500],
            dedupe_key=f"{key}:{tenant.pk}",
        )
        for tenant, message in tenant_messages.items()
    ]
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock not granted in time
# How long a tick waits for a round's row lock before leaving the round to whoever holds it:
# long enough for a bid (which locks the round for milliseconds) to finish, far shorter than
# a clearing or a settlement.
BUSY_AFTER_MS = 2000


def locked_briefly(rows, *, wait: bool, what: str):
    """``rows()`` (a query that takes row locks): as is when ``wait``; otherwise, on
    PostgreSQL, waiting at most BUSY_AFTER_MS for the locks, then RoundBusy (the embedded
    SQLite has no row locks to wait on). Runs inside the caller's transaction."""
    if wait or connection.vendor != "postgresql":
        return rows()
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{BUSY_AFTER_MS}ms'")
    try:
        found = rows()
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise RoundBusy(f"{what} is being processed by another worker; try again") from exc
        raise
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout TO DEFAULT")
    return found


def round_locked(
    round_id: int, *, wait: bool = True, related: tuple[str, ...] = ("policy",)
) -> Round:
    """The round row, locked for the rest of the transaction (``related`` read alongside).
    ``wait=False``: RoundBusy if another transaction holds it for more than BUSY_AFTER_MS."""
    rows = Round.objects.select_for_update(of=("self",)).select_related(*related)
    return locked_briefly(lambda: rows.get(pk=round_id), wait=wait, what=f"round {round_id}")


def bids_locked(rnd: Round, *, status: str) -> list[Bid]:
    """The round's bids in ``status``, locked in pk order, with what the ledger needs: each
    bid's tenant and campaign, one object per tenant and per campaign, read once (a join
    made a tenant object per bid: a million of them for a million-bid round)."""
    bids = list(
        Bid.objects.select_for_update(of=("self",)).filter(round=rnd, status=status).order_by("pk")
    )
    tenants = Tenant.objects.in_bulk({bid.tenant_id for bid in bids})
    campaigns = Campaign.objects.in_bulk({bid.campaign_id for bid in bids} - {None})
    for bid in bids:
        bid.tenant = tenants[bid.tenant_id]
        if bid.campaign_id is not None:
            bid.campaign = campaigns[bid.campaign_id]
    return bids
