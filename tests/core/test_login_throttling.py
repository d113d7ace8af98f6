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
def test_wrong_passwords_lock_the_username_and_the_right_one_then_fails(url):
    user = factories.admin_user()
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    for i in range(limit):
        # Each attempt from another address: the username alone is what gets locked.
        _post(client, url, user.username, "wrong", f"10.0.0.{i + 1}")
    response = _post(client, url, user.username, "pw-admin-123", "10.0.1.1")
    assert response.status_code == 429
    assert not _signed_in(client)
    assert b"Too many failed sign-in attempts" in response.content
    event = AuditEvent.objects.filter(action="auth.lockout").latest("seq")
    assert event.after["username"] == user.username


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
