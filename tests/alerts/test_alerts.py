"""Alerts that leave the app: digests by email over a real SMTP server, signed webhooks to a
real HTTP server, retries with backoff, refusals, and the pages."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Message
from django.db import connection

from alerts.errors import AlertError
from alerts.kinds import category
from alerts.models import Delivery, Webhook
from alerts.services import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    delivery_send,
    digest_run,
    preference_set,
    retry_delay,
    webhook_create,
)
from audit.models import AuditEvent
from tenants.models import Membership, Notification
from tests import factories
from tests.conftest import free_port

pytestmark = pytest.mark.django_db


class _Inbox(Message):
    def __init__(self):
        super().__init__()
        self.messages = []

    def handle_message(self, message):
        self.messages.append(message)


@pytest.fixture
def smtp(settings):
    """A real SMTP server on a free local port, and Django's SMTP backend pointed at it."""
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    try:
        yield inbox
    finally:
        controller.stop()


class _Receiver:
    """A real HTTP server on loopback that records each POST and answers as told."""

    def __init__(self, answers=(200,), delay=0.0):
        self.requests: list[tuple[dict, bytes]] = []
        self.answers = list(answers)
        self.delay = delay
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the standard library's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                time.sleep(receiver.delay)
                code = receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]
                self.send_response(code)
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.GPUMARKET_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    made = []

    def make(**kwargs):
        r = _Receiver(**kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def _team_with_people():
    team = factories.tenant(name="Vision")
    manager = factories.member(tenant=team, username="alice", role=Membership.Role.MANAGER)
    researcher = factories.member(tenant=team, username="ana")
    for user in (manager, researcher):
        user.email = f"{user.username}@example.org"
        user.save(update_fields=["email"])
    return team, manager, researcher


def _notice(team, kind, message, level=Notification.Level.WARNING):
    return Notification.objects.create(tenant=team, kind=kind, message=message, level=level)


def test_each_kind_of_notice_falls_in_the_category_people_choose_by():
    assert category("budget") == "budget"
    assert category("order_budget_exhausted") == "budget"
    assert category("work_paused") == "pauses"
    assert category("gpu_reclaimed") == "pauses"
    assert category("order_suspended") == "preemptions"
    assert category("allocation_ended") == "preemptions"
    assert category("round_result") == "rounds"
    assert category("backfill_won") == "rounds"
    assert category("approval_requested") == "approvals"
    assert category("policy_guardrail") == "other"


def test_one_digest_per_person_per_run_over_a_real_smtp_server(smtp):
    team, manager, researcher = _team_with_people()
    other = factories.tenant(name="Language")
    preference_set(user=manager, email_categories=["budget", "pauses"])
    _notice(team, "budget", "Vision has spent 80 % of its daily budget")
    _notice(team, "work_paused", "Job 12 was paused: over the hard cap")
    _notice(team, "round_result", "Round 7: won 2 GPUs", level=Notification.Level.INFO)
    _notice(other, "budget", "Language has spent 80 % of its daily budget")

    report = digest_run()
    assert (report.notices, report.emails, report.webhooks) == (4, 1, 0)
    delivery = Delivery.objects.get()
    assert (delivery.user, delivery.target, delivery.notices) == (manager, "alice@example.org", 2)
    assert delivery_send(delivery_id=delivery.pk).status == Delivery.Status.SENT

    assert len(smtp.messages) == 1
    mail = smtp.messages[0]
    assert mail["To"] == "alice@example.org"
    assert "2 notices for" in mail["Subject"]
    body = mail.get_payload()
    assert "80 % of its daily budget" in body and "Job 12 was paused" in body
    assert "Round 7" not in body and "Language" not in body  # not chosen; another team's

    # The next run sends nothing again, and a second send of the same delivery is a no-op.
    assert digest_run().emails == 0
    assert delivery_send(delivery_id=delivery.pk).status == Delivery.Status.SENT
    assert len(smtp.messages) == 1


def test_platform_notices_go_to_the_staff_who_asked(smtp):
    admin = factories.admin_user("root")
    admin.email = "root@example.org"
    admin.save(update_fields=["email"])
    preference_set(user=admin, email_categories=["other"])
    Notification.objects.create(tenant=None, kind="policy_guardrail", message="v3 rolled back")
    digest_run()
    delivery_send(delivery_id=Delivery.objects.get(user=admin).pk)
    assert [m["To"] for m in smtp.messages] == ["root@example.org"]
    assert "the platform" in smtp.messages[0]["Subject"]


def test_a_preference_for_email_needs_an_address_and_a_known_category():
    team = factories.tenant()
    user = factories.member(tenant=team)
    with pytest.raises(AlertError, match="no email address"):
        preference_set(user=user, email_categories=["budget"])
    user.email = "u@example.org"
    with pytest.raises(AlertError, match="unknown everything"):
        preference_set(user=user, email_categories=["everything"])
    preference_set(user=user, email_categories=["rounds"])
    assert AuditEvent.objects.filter(action="alerts.preference_set").count() == 1


def test_a_webhook_digest_is_signed_so_the_receiver_can_check_it(receiver):
    team, manager, _ = _team_with_people()
    server = receiver()
    hook, secret = webhook_create(
        tenant=team, actor=manager, url=server.url, categories=["pauses", "rounds"]
    )
    _notice(team, "work_paused", "Job 12 was paused")
    _notice(team, "budget", "80 % spent")  # not a category this webhook takes
    assert digest_run().webhooks == 1
    delivery = Delivery.objects.get(channel=Delivery.Channel.WEBHOOK)
    outcome = delivery_send(delivery_id=delivery.pk)
    assert outcome.status == Delivery.Status.SENT

    ((headers, body),) = server.requests
    stamp = headers[TIMESTAMP_HEADER]
    expected = (
        "sha256="
        + hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    )
    assert hmac.compare_digest(headers[SIGNATURE_HEADER], expected)
    sent = json.loads(body)
    assert sent["team"] == team.slug and sent["delivery"] == delivery.pk
    assert [n["message"] for n in sent["notices"]] == ["Job 12 was paused"]
    delivery.refresh_from_db()
    assert delivery.response_status == 200 and delivery.sent_at is not None
    # The secret is never written to the audit log.
    event = AuditEvent.objects.get(action="alerts.webhook_create")
    assert secret not in json.dumps(event.after)


def test_a_webhook_secret_is_sealed_at_rest_and_opens_after_a_key_rotation(receiver, settings):
    # A copy of the database alone must not let anyone sign as the platform: the secret is
    # kept sealed under a key derived from SECRET_KEY, and a rotated key (the old one kept in
    # SECRET_KEY_FALLBACKS) still opens it.
    team, manager, _ = _team_with_people()
    server = receiver()
    hook, secret = webhook_create(tenant=team, actor=manager, url=server.url, categories=["pauses"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM alerts_webhook WHERE id = %s", [hook.pk])
        row = cursor.fetchone()
    assert not any(secret in str(value) for value in row)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-key-" + "x" * 50
    _notice(team, "work_paused", "Job 12 was paused")
    digest_run()
    delivery = Delivery.objects.get(channel=Delivery.Channel.WEBHOOK)
    assert delivery_send(delivery_id=delivery.pk).status == Delivery.Status.SENT
    ((headers, body),) = server.requests
    stamp = headers[TIMESTAMP_HEADER]
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == "sha256=" + mac
    # With the old key gone, the delivery fails with what to do, not a 500 or a wrong signature.
    settings.SECRET_KEY_FALLBACKS = []
    _notice(team, "work_paused", "Job 13 was paused")
    digest_run()
    second = Delivery.objects.filter(channel=Delivery.Channel.WEBHOOK).latest("pk")
    failed = delivery_send(delivery_id=second.pk)
    assert failed.status != Delivery.Status.SENT
    second.refresh_from_db()
    assert "create the webhook again" in second.last_error
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:9/hook", "loopback, private or reserved"),
        ("http://10.1.2.3/hook", "loopback, private or reserved"),
        ("http://169.254.169.254/latest/meta-data", "loopback, private or reserved"),
        ("http://[::1]/hook", "loopback, private or reserved"),
        ("ftp://example.org/hook", "http or https"),
        ("http://user:pw@example.org/hook", "no user name or password"),
    ],
)
def test_a_webhook_to_a_private_address_is_refused(url, why):
    team, manager, _ = _team_with_people()
    with pytest.raises(AlertError, match=why):
        webhook_create(tenant=team, actor=manager, url=url, categories=["rounds"])
    assert not Webhook.objects.exists()


def test_an_operator_may_allow_a_private_host(settings):
    team, manager, _ = _team_with_people()
    settings.GPUMARKET_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    hook, _ = webhook_create(
        tenant=team, actor=manager, url="http://127.0.0.1:9/hook", categories=["rounds"]
    )
    assert hook.active


def test_a_failing_webhook_is_retried_with_a_doubling_delay_then_given_up(receiver, settings):
    settings.GPUMARKET_ALERT_MAX_ATTEMPTS = 3
    settings.GPUMARKET_ALERT_RETRY_BASE_SECONDS = 30
    team, manager, _ = _team_with_people()
    server = receiver(answers=(500,))
    webhook_create(tenant=team, actor=manager, url=server.url, categories=["pauses"])
    _notice(team, "work_paused", "Job 12 was paused")
    digest_run()
    delivery = Delivery.objects.get()
    delays = []
    for _ in range(3):
        outcome = delivery_send(delivery_id=delivery.pk)
        delays.append(outcome.retry_in)
    delivery.refresh_from_db()
    assert delays == [30, 60, None]
    assert (delivery.status, delivery.attempts) == (Delivery.Status.FAILED, 3)
    assert "HTTP 500" in delivery.last_error and delivery.response_status == 500
    assert len(server.requests) == 3
    assert retry_delay(20) == 3600  # never more than an hour apart


def test_a_webhook_that_hangs_times_out_and_never_holds_up_settlement(receiver, settings):
    from datetime import timedelta

    from market.services.bids import bid_place
    from market.services.round_clearing import round_clear
    from market.services.settlement import round_settle
    from tests.market.marketkit import market_make

    settings.GPUMARKET_WEBHOOK_TIMEOUT_SECONDS = 1
    market = market_make()
    team = factories.tenant(name="Vision", credits=100_000)
    manager = factories.member(tenant=team, role=Membership.Role.MANAGER)
    server = receiver(delay=5)
    webhook_create(tenant=team, actor=manager, url=server.url, categories=["rounds"])
    rnd = market.round
    bid_place(
        user=manager, tenant=team, round=rnd, now=rnd.opens_at, quantity=1, limits={"a100": 5000}
    )
    round_clear(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
    round_settle(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=2))
    # Settlement wrote the team's notice and sent nothing: the webhook is not on its path.
    assert Notification.objects.filter(tenant=team, kind="round_result").exists()
    assert not server.requests and not Delivery.objects.exists()
    digest_run()
    delivery = Delivery.objects.get()
    outcome = delivery_send(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert outcome.status == Delivery.Status.RETRYING
    assert "timed out" in delivery.last_error.lower()


def test_the_pages_keep_webhooks_to_managers_and_logs_to_the_team(client, settings):
    settings.GPUMARKET_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    team, manager, researcher = _team_with_people()
    other = factories.tenant(name="Language")
    other_manager = factories.member(tenant=other, role=Membership.Role.MANAGER)
    hook, _ = webhook_create(
        tenant=other, actor=other_manager, url="http://127.0.0.1:9/x", categories=["rounds"]
    )
    _notice(other, "round_result", "Language won 4 GPUs")
    digest_run()

    client.force_login(researcher)
    page = client.get("/alerts/")
    assert page.status_code == 200 and b"Language won" not in page.content
    assert b"127.0.0.1:9" not in page.content  # another team's webhook and its log
    refused = client.post(
        "/alerts/webhooks/new/", {"url": "http://127.0.0.1:9/y", "categories": ["rounds"]}
    )
    assert refused.status_code == 403
    saved = client.post("/alerts/", {"email_categories": ["budget", "rounds"]})
    assert saved.status_code == 302

    client.force_login(manager)
    assert client.post(f"/alerts/webhooks/{hook.pk}/disable/").status_code == 404
    hook.refresh_from_db()
    assert hook.active
    bad = client.post(
        "/alerts/webhooks/new/", {"url": "http://10.0.0.1/y", "categories": ["rounds"]}
    )
    assert bad.status_code == 400 and b"private or reserved" in bad.content
    made = client.post(
        "/alerts/webhooks/new/", {"url": "http://127.0.0.1:9/y", "categories": ["rounds"]}
    )
    assert made.status_code == 200 and b"signing secret" in made.content
    assert Webhook.objects.filter(tenant=team, active=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_retries_a_failing_webhook_until_it_answers(
    transactional_db, redis_url, tmp_path, receiver
):
    """Beat's digest sent through the broker to a real worker: the webhook fails twice, the
    worker retries after 1 s and 2 s, and the third attempt lands."""
    import redis
    from celery import Celery

    from tests.conftest import CeleryWorker, test_database_url

    team, manager, _ = _team_with_people()
    server = receiver(answers=(503, 500, 200))
    webhook_create(tenant=team, actor=manager, url=server.url, categories=["pauses"])
    _notice(team, "work_paused", "Job 12 was paused")
    redis.Redis.from_url(redis_url).flushdb()
    worker = CeleryWorker(
        database_url=test_database_url(),
        broker_url=redis_url,
        log_path=tmp_path / "worker.log",
        queues="default",
        extra_env={
            "GPUMARKET_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "GPUMARKET_ALERT_RETRY_BASE_SECONDS": "1",
        },
    )
    worker.start()
    try:
        Celery(broker=redis_url).send_task("alerts.digest", queue="default")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            delivery = Delivery.objects.filter(channel=Delivery.Channel.WEBHOOK).first()
            if delivery and delivery.status == Delivery.Status.SENT:
                break
            time.sleep(0.5)
    finally:
        worker.stop()
    assert delivery is not None, (tmp_path / "worker.log").read_text()[-3000:]
    assert (delivery.status, delivery.attempts) == (Delivery.Status.SENT, 3), (
        tmp_path / "worker.log"
    ).read_text()[-3000:]
    assert len(server.requests) == 3


def test_the_digest_runs_on_the_embedded_default_database(tmp_path):
    # The demo and a first install run on SQLite, where the digest's resend query (a UNION
    # of two ordered querysets) failed every run: "ORDER BY not allowed in subqueries of
    # compound statements". Migrate a SQLite database and run the digest task's two steps.
    root = Path(__file__).resolve().parents[2]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL"}
    }
    env.update(
        DEBUG="1",
        DATABASE_URL=f"sqlite:///{tmp_path / 'embedded.sqlite3'}",
        GPUMARKET_VAR_DIR=str(tmp_path / "var"),
    )
    manage = [sys.executable, str(root / "manage.py")]
    migrated = subprocess.run(
        [*manage, "migrate", "-v0"], env=env, cwd=root, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr
    code = "from alerts.services import deliveries_resend, digest_run; digest_run(); print(deliveries_resend())"
    ran = subprocess.run(
        [*manage, "shell", "-c", code], env=env, cwd=root, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "0"
