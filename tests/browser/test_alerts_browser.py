"""In Chromium: a manager chooses email alerts, adds a webhook (a private address refused
with the reason, then an allowed one, whose secret is shown once), and the team's delivery
log shows the digest a real receiver got."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alerts.models import AlertPreference, Delivery, Webhook
from alerts.services import delivery_send, digest_run
from core.sealed import unseal
from tenants.models import Membership, Notification
from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"


@pytest.fixture
def receiver():
    got = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the standard library's name
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    server.server_close()


def test_a_manager_sets_up_alerts_and_sees_what_was_sent(page, live_server, settings, receiver):
    url, got = receiver
    team = factories.tenant(name="Vision Lab")
    manager = factories.member(
        tenant=team, username="mira", password=PASSWORD, role=Membership.Role.MANAGER
    )
    manager.email = "mira@example.org"
    manager.save(update_fields=["email"])
    login(page, "mira", PASSWORD)
    page.goto("/alerts/")

    page.check("input[name=email_categories][value=budget]")
    page.check("input[name=email_categories][value=pauses]")
    page.click("form[action='/alerts/'] button[type=submit]")
    page.wait_for_selector("text=Saved which alerts you get by email")
    assert AlertPreference.objects.get(user=manager).email_categories == ["budget", "pauses"]

    page.fill("#id_url", "http://10.0.0.7/hook")
    page.check("input[name=categories][value=pauses]")
    page.click("button:text-is('Add webhook')")
    page.wait_for_selector("text=private or reserved address")
    assert not Webhook.objects.exists()

    settings.GPUMARKET_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    page.fill("#id_url", url)
    page.check("input[name=categories][value=pauses]")
    page.click("button:text-is('Add webhook')")
    page.wait_for_selector("#webhook-secret")
    hook = Webhook.objects.get()
    secret = unseal(hook.secret_sealed, what="the test's webhook", remedy="-")
    assert secret in page.inner_text("#webhook-secret")
    assert secret not in hook.secret_sealed

    Notification.objects.create(tenant=team, kind="work_paused", message="Job 12 was paused")
    digest_run()
    for delivery in Delivery.objects.all():
        delivery_send(delivery_id=delivery.pk)
    assert len(got) == 1
    page.goto("/alerts/")
    log = page.inner_text("#deliveries")
    assert "Webhook" in log and "Sent (HTTP 204)" in log and "mira@example.org" in log
    assert secret not in page.content()  # shown once only
    shot(page, "95-alerts")
