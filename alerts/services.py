"""Every write of the alerts app: preferences, webhooks, the digest run and a delivery.

The digest reads the notifications the platform already writes (tenants.Notification, made
by every app, often in bulk) past a cursor, so no service elsewhere has to know about email
or webhooks, and a notice goes out once: one digest per recipient per run, never one
message per notice. A delivery is sent by a task (``alerts.deliver``, queued by name after
the digest commits), never inside the transaction that made the notice, so a slow or
failing mail server or webhook cannot hold up settlement.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

import audit.services as audit
from alerts.errors import AlertError
from alerts.kinds import CATEGORIES, category
from alerts.models import AlertPreference, Delivery, DigestCursor, Webhook
from alerts.safety import webhook_url_check
from core.sealed import SealBroken, seal, unseal
from tenants.access import access_object
from tenants.models import Membership, Notification, Tenant

DELIVER_TASK = "alerts.deliver"
CURSOR = "notifications"
SIGNATURE_HEADER = "X-Gpumarket-Signature"
TIMESTAMP_HEADER = "X-Gpumarket-Timestamp"


def _categories_check(categories: object, *, field: str) -> list[str]:
    if not isinstance(categories, list | tuple) or not all(isinstance(c, str) for c in categories):
        raise AlertError(f"{field}: a list of categories")
    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:
        raise AlertError(
            f"{field}: unknown {', '.join(unknown)}; choose from {', '.join(CATEGORIES)}"
        )
    return [c for c in CATEGORIES if c in set(categories)]


@transaction.atomic
def preference_set(*, user: AbstractBaseUser, email_categories: list[str]) -> AlertPreference:
    """The categories ``user`` wants by email (none turns email off)."""
    chosen = _categories_check(email_categories, field="email_categories")
    if chosen and not getattr(user, "email", ""):
        raise AlertError("email_categories: your account has no email address to send to")
    preference, _ = AlertPreference.objects.select_for_update().get_or_create(user=user)
    before = list(preference.email_categories)
    preference.email_categories = chosen
    preference.save(update_fields=["email_categories", "updated_at"])
    audit.record(
        actor=user,
        action="alerts.preference_set",
        target=preference,
        before={"email_categories": before},
        after={"email_categories": chosen},
    )
    return preference


@transaction.atomic
def webhook_create(
    *, tenant: Tenant, actor: AbstractBaseUser, url: str, categories: list[str]
) -> tuple[Webhook, str]:
    """A webhook for ``tenant``; returns it with its signing secret, to show once."""
    chosen = _categories_check(categories, field="categories")
    if not chosen:
        raise AlertError("categories: choose at least one category to send")
    url = webhook_url_check(url)
    if (
        Webhook.objects.filter(tenant=tenant, active=True).count()
        >= settings.GPUMARKET_WEBHOOKS_PER_TEAM
    ):
        raise AlertError(
            f"a team may have at most {settings.GPUMARKET_WEBHOOKS_PER_TEAM} webhooks; "
            "disable one first"
        )
    secret = secrets.token_hex(32)
    hook = Webhook.objects.create(
        tenant=tenant, url=url, categories=chosen, secret_sealed=seal(secret), created_by=actor
    )
    audit.record(
        actor=actor,
        action="alerts.webhook_create",
        target=hook,
        tenant=tenant,
        after={"url": url, "categories": chosen},
    )
    return hook, secret


@transaction.atomic
def webhook_disable(*, tenant: Tenant, actor: AbstractBaseUser, webhook_id: object) -> Webhook:
    """Stop sending to one of ``tenant``'s webhooks (404 for another team's)."""
    hook = access_object(Webhook.objects.select_for_update(), tenant=tenant, pk=webhook_id)
    if hook.active:
        hook.active = False
        hook.save(update_fields=["active"])
        audit.record(
            actor=actor,
            action="alerts.webhook_disable",
            target=hook,
            tenant=tenant,
            before={"active": True},
            after={"active": False},
        )
    return hook


@dataclass(frozen=True)
class DigestReport:
    notices: int
    emails: int
    webhooks: int


def _notice_json(notice: Notification) -> dict:
    return {
        "id": notice.pk,
        "kind": notice.kind,
        "category": category(notice.kind),
        "level": notice.level,
        "message": notice.message,
        "created_at": notice.created_at.isoformat(),
    }


def _recipients(tenant_ids: set[int | None]) -> dict[int | None, list]:
    """Who reads each team's notices by email: its members; platform notices: staff."""
    User = get_user_model()
    people: dict[int | None, list] = defaultdict(list)
    team_ids = {t for t in tenant_ids if t is not None}
    for membership in Membership.objects.filter(tenant_id__in=team_ids).select_related(
        "user__alert_preference"
    ):
        people[membership.tenant_id].append(membership.user)
    if None in tenant_ids:
        people[None] = list(
            User.objects.filter(is_staff=True, is_active=True).select_related("alert_preference")
        )
    return people


@transaction.atomic
def digest_run(*, limit: int = 10_000) -> DigestReport:
    """Hand the notifications written since the last run to email and webhooks: per team,
    one digest per member who chose any of their categories and one per active webhook
    that takes any of them. Single-flight (the cursor row is locked); each delivery is sent
    by ``alerts.deliver`` once this commits."""
    DigestCursor.objects.get_or_create(name=CURSOR)
    cursor = DigestCursor.objects.select_for_update().get(name=CURSOR)
    notices = list(
        Notification.objects.filter(pk__gt=cursor.last_notification_id).order_by("pk")[:limit]
    )
    cursor.ran_at = timezone.now()
    if not notices:
        cursor.save(update_fields=["ran_at"])
        return DigestReport(0, 0, 0)
    by_team: dict[int | None, list[Notification]] = defaultdict(list)
    for notice in notices:
        by_team[notice.tenant_id].append(notice)
    deliveries = _email_deliveries(by_team) + _webhook_deliveries(by_team)
    Delivery.objects.bulk_create(deliveries)
    cursor.last_notification_id = notices[-1].pk
    cursor.save(update_fields=["last_notification_id", "ran_at"])
    ids = [d.pk for d in deliveries]
    transaction.on_commit(lambda: _queue(ids))
    return DigestReport(
        notices=len(notices),
        emails=sum(d.channel == Delivery.Channel.EMAIL for d in deliveries),
        webhooks=sum(d.channel == Delivery.Channel.WEBHOOK for d in deliveries),
    )


def _digest(team: Tenant | None, notices: list[Notification]) -> dict:
    return {
        "team": team.slug if team else None,
        "notices": [_notice_json(n) for n in notices],
    }


def _email_deliveries(by_team: dict[int | None, list[Notification]]) -> list[Delivery]:
    teams = Tenant.objects.in_bulk([t for t in by_team if t is not None])
    out = []
    for team_id, people in _recipients(set(by_team)).items():
        for user in people:
            preference = getattr(user, "alert_preference", None)
            wanted = set(preference.email_categories) if preference else set()
            chosen = [n for n in by_team[team_id] if category(n.kind) in wanted]
            if chosen and user.email:
                out.append(
                    Delivery(
                        channel=Delivery.Channel.EMAIL,
                        tenant_id=team_id,
                        user=user,
                        target=user.email,
                        payload=_digest(teams.get(team_id), chosen),
                        notices=len(chosen),
                    )
                )
    return out


def _webhook_deliveries(by_team: dict[int | None, list[Notification]]) -> list[Delivery]:
    out = []
    hooks = Webhook.objects.filter(
        tenant_id__in=[t for t in by_team if t is not None], active=True
    ).select_related("tenant")
    for hook in hooks:
        chosen = [n for n in by_team[hook.tenant_id] if category(n.kind) in set(hook.categories)]
        if chosen:
            out.append(
                Delivery(
                    channel=Delivery.Channel.WEBHOOK,
                    tenant_id=hook.tenant_id,
                    webhook=hook,
                    target=hook.url,
                    payload=_digest(hook.tenant, chosen),
                    notices=len(chosen),
                )
            )
    return out


def _queue(ids: list[int]) -> None:
    for pk in ids:
        try:
            current_app.send_task(DELIVER_TASK, args=[pk])
        except Exception:  # noqa: BLE001 - the row stays pending; deliveries_resend picks it up
            return


def retry_delay(attempts: int) -> int:
    """Seconds before attempt ``attempts + 1``: doubling from the base, at most an hour."""
    base = settings.GPUMARKET_ALERT_RETRY_BASE_SECONDS
    return int(min(base * 2 ** max(attempts - 1, 0), 3600))


@dataclass(frozen=True)
class SendOutcome:
    status: str
    retry_in: int | None = None  # seconds, when it should be tried again


def delivery_send(*, delivery_id: int, now: datetime | None = None) -> SendOutcome:
    """Send one delivery (idempotent: a delivery already sent or given up is left alone).
    The row is claimed by one conditional update, so two workers never send it both; the
    network call runs outside any transaction."""
    claimed = Delivery.objects.filter(
        pk=delivery_id, status__in=[Delivery.Status.PENDING, Delivery.Status.RETRYING]
    ).update(status=Delivery.Status.SENDING, attempts=F("attempts") + 1)
    delivery = Delivery.objects.select_related("webhook").get(pk=delivery_id)
    if not claimed:
        return SendOutcome(delivery.status)
    try:
        if delivery.channel == Delivery.Channel.EMAIL:
            _email_send(delivery)
        else:
            delivery.response_status = _webhook_post(delivery)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded on the row
        return _failed(delivery, error=f"{type(exc).__name__}: {exc}", now=now)
    delivery.status = Delivery.Status.SENT
    delivery.sent_at = now or timezone.now()
    delivery.last_error = ""
    delivery.next_attempt_at = None
    delivery.save(
        update_fields=["status", "sent_at", "last_error", "next_attempt_at", "response_status"]
    )
    return SendOutcome(delivery.status)


def _failed(delivery: Delivery, *, error: str, now: datetime | None) -> SendOutcome:
    delivery.last_error = error[:500]
    if delivery.attempts >= settings.GPUMARKET_ALERT_MAX_ATTEMPTS:
        delivery.status = Delivery.Status.FAILED
        delivery.next_attempt_at = None
        retry_in = None
    else:
        retry_in = retry_delay(delivery.attempts)
        delivery.status = Delivery.Status.RETRYING
        delivery.next_attempt_at = (now or timezone.now()) + timedelta(seconds=retry_in)
    delivery.save(update_fields=["status", "last_error", "next_attempt_at", "response_status"])
    return SendOutcome(delivery.status, retry_in)


def _email_send(delivery: Delivery) -> None:
    notices = delivery.payload["notices"]
    team = delivery.payload.get("team") or "the platform"
    subject = f"[gpumarket] {len(notices)} notice{'s' * (len(notices) != 1)} for {team}"
    lines = [
        f"{n['created_at'][:16].replace('T', ' ')} UTC  [{n['level']}] {n['message']}"
        for n in notices
    ]
    body = "\n".join(
        [
            f"What gpumarket told {team} since the last digest:",
            "",
            *lines,
            "",
            "Choose which alerts you get by email on the Alerts page.",
        ]
    )
    EmailMessage(subject=subject, body=body, to=[delivery.target]).send(fail_silently=False)


def signature(secret: str, *, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 over ``timestamp + "." + body``: what a receiver
    recomputes with its secret to know the body is ours and fresh."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _secret(hook: Webhook) -> str:
    try:
        return unseal(
            hook.secret_sealed,
            what=f"webhook {hook.pk}'s signing secret",
            remedy="create the webhook again for a new secret",
        )
    except SealBroken as exc:
        raise AlertError(str(exc)) from exc


def _webhook_post(delivery: Delivery) -> int:
    hook = delivery.webhook
    if hook is None or not hook.active:
        raise AlertError("the webhook was disabled")
    url = webhook_url_check(hook.url)
    body = json.dumps(
        {"delivery": delivery.pk, **delivery.payload}, sort_keys=True, separators=(",", ":")
    ).encode()
    stamp = str(int(time.time()))
    response = requests.post(
        url,
        data=body,
        headers={
            "Content-Type": "application/json",
            "User-Agent": "gpumarket-webhook",
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: signature(_secret(hook), timestamp=stamp, body=body),
        },
        timeout=settings.GPUMARKET_WEBHOOK_TIMEOUT_SECONDS,
        allow_redirects=False,
    )
    if not 200 <= response.status_code < 300:
        delivery.response_status = response.status_code
        raise AlertError(f"the webhook answered HTTP {response.status_code}")
    return response.status_code


def deliveries_resend() -> int:
    """Queue again what is due: retries whose time has come, and deliveries left pending
    (the broker was down when the digest ran). Beat runs it with the digest."""
    now = timezone.now()
    due = list(
        Delivery.objects.filter(
            Q(status=Delivery.Status.RETRYING, next_attempt_at__lte=now)
            | Q(status=Delivery.Status.PENDING, created_at__lte=now - timedelta(minutes=5))
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    _queue(due)
    return len(due)
