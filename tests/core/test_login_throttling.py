"""Login throttling (django-axes): too many wrong passwords lock the username, and too many from
one address lock that address, on the site login and on /admin/login/; the right password
does not get through a lock-out, and the lock-out is an audit event."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

from audit.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

LOGINS = ["/login/", "/admin/login/"]


def _post(client: Client, url: str, username: str, password: str, ip: str):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=ip)


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("url", LOGINS)
def test_wrong_passwords_from_elsewhere_do_not_lock_out_the_owner(url):
    user = factories.admin_user()
    attacker = Client()
    limit = settings.AXES_FAILURE_LIMIT
    for i in range(3 * limit):
        # Many addresses, each under the limit: the username alone is never locked.
        _post(attacker, url, user.username, "wrong", f"10.0.{i // 5}.{i % 5 + 1}")
    owner = Client()
    response = _post(owner, url, user.username, "pw-admin-123", "10.0.200.1")
    assert response.status_code == 302 and _signed_in(owner)


@pytest.mark.parametrize("url", LOGINS)
def test_wrong_passwords_for_a_username_from_one_address_lock_that_pair(url):
    user = factories.admin_user()
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _post(client, url, user.username, "wrong", "10.0.1.1")
    response = _post(client, url, user.username, "pw-admin-123", "10.0.1.1")
    assert response.status_code == 429
    assert not _signed_in(client)
    assert b"Too many failed sign-in attempts" in response.content
    event = AuditEvent.objects.filter(action="auth.lockout").latest("seq")
    assert event.after["username"] == user.username
    assert event.after["ip_address"] == "10.0.1.1"


def test_a_lock_is_one_audit_event_however_many_attempts_it_refuses():
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT + 40):
        _post(client, "/login/", "", "", "10.7.7.7")
    for i in range(20):
        _post(client, "/login/", f"guess{i}", "wrong", "10.7.7.7")
    assert AuditEvent.objects.filter(action="auth.lockout").count() == 1


def test_a_staff_member_unlocks_an_address_on_the_admin_page():
    victim = factories.admin_user()
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _post(client, "/login/", victim.username, "wrong", "10.5.5.5")
    assert _post(client, "/login/", victim.username, "pw-admin-123", "10.5.5.5").status_code == 429
    from axes.models import AccessAttempt

    admin = factories.admin_user()
    staff = Client()
    staff.force_login(admin)
    page = staff.get("/admin/axes/accessattempt/")
    assert page.status_code == 200 and b"10.5.5.5" in page.content
    ids = [str(pk) for pk in AccessAttempt.objects.values_list("pk", flat=True)]
    response = staff.post(
        "/admin/axes/accessattempt/",
        {"action": "unlock", "_selected_action": ids},
    )
    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()
    event = AuditEvent.objects.filter(action="auth.unlock").latest("seq")
    assert event.actor_label == admin.username
    assert event.after["ip_addresses"] == ["10.5.5.5"]
    response = _post(Client(), "/login/", victim.username, "pw-admin-123", "10.5.5.5")
    assert response.status_code == 302


@pytest.mark.parametrize("url", LOGINS)
def test_wrong_passwords_from_one_address_lock_that_address_for_every_username(url):
    victim = factories.admin_user()
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        _post(client, url, f"guess{i}", "wrong", "10.9.9.9")
    response = _post(client, url, victim.username, "pw-admin-123", "10.9.9.9")
    assert response.status_code == 429 and not _signed_in(client)
    # Another address is not locked out.
    other = Client()
    response = _post(other, url, victim.username, "pw-admin-123", "10.9.9.10")
    assert response.status_code == 302 and _signed_in(other)


def test_a_few_wrong_passwords_then_the_right_one_still_signs_in():
    user = factories.admin_user()
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _post(client, "/login/", user.username, "wrong", "10.1.1.1")
    response = _post(client, "/login/", user.username, "pw-admin-123", "10.1.1.1")
    assert response.status_code == 302 and _signed_in(client)
    assert not AuditEvent.objects.filter(action="auth.lockout").exists()
