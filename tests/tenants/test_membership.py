"""Team membership on the team page: a manager creates new accounts (Django's username and
password validators, NFKC, no look-alike of an existing name) and never attaches an existing
account: not the platform superuser, not another team's member, not a tenantless account. The
last manager cannot be demoted or removed; a role change and a removal are confirmed first."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from audit.models import AuditEvent
from tenants.models import Membership
from tests import factories

pytestmark = pytest.mark.django_db

GOOD_PASSWORD = "correct-horse-battery-7"


def _create(client, username: str, password: str = GOOD_PASSWORD, again: str | None = None):
    return client.post(
        reverse("team_members"),
        {
            "username": username,
            "role": "researcher",
            "password1": password,
            "password2": password if again is None else again,
        },
    )


def test_a_manager_creates_a_new_account_with_a_good_password(client, lab):
    tenant, manager, _ = lab
    client.force_login(manager)
    response = _create(client, "newbie")
    assert response.status_code == 302
    user = get_user_model().objects.get(username="newbie")
    assert user.check_password(GOOD_PASSWORD) and not user.is_staff
    assert Membership.objects.get(user=user).tenant == tenant
    event = AuditEvent.objects.filter(action="membership.create").latest("seq")
    assert event.after == {"user": "newbie", "role": "researcher"}


@pytest.mark.parametrize(
    "who",
    ["superuser", "tenantless", "other-team"],
)
def test_an_existing_account_is_never_attached(client, lab, who):
    tenant, manager, _ = lab
    User = get_user_model()
    if who == "superuser":
        target = User.objects.create_superuser("root", password="x-root-password-1")
    elif who == "tenantless":
        target = User.objects.create_user("loner", password="x-loner-password-1")
    else:
        target = factories.member(tenant=factories.tenant(name="Speech Lab"))
    client.force_login(manager)
    response = _create(client, target.username)
    assert response.status_code == 400
    assert b"is taken" in response.content
    assert not Membership.objects.filter(user=target, tenant=tenant).exists()
    target.refresh_from_db()
    assert not target.check_password(GOOD_PASSWORD)


@pytest.mark.parametrize(
    ("username", "words"),
    [
        pytest.param("ROOT", "is taken", id="case-of-an-existing-name"),
        pytest.param("\uff52\uff4f\uff4f\uff54", "is taken", id="fullwidth-nfkc-to-existing"),
        pytest.param("r\u043e\u043et", "letters, digits", id="cyrillic-look-alike"),
        pytest.param("has space", "letters, digits", id="space"),
    ],
)
def test_look_alike_and_invalid_usernames_are_refused(client, lab, username, words):
    _, manager, _ = lab
    get_user_model().objects.create_superuser("root", password="x-root-password-1")
    client.force_login(manager)
    users = get_user_model().objects.count()
    response = _create(client, username)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert get_user_model().objects.count() == users


@pytest.mark.parametrize(
    ("password", "again", "words"),
    [
        pytest.param("short", None, "too short", id="too-short"),
        pytest.param("password123", None, "too common", id="common"),
        pytest.param("12345678901", None, "entirely numeric", id="numeric"),
        pytest.param(GOOD_PASSWORD, GOOD_PASSWORD + "x", "do not match", id="typo-in-confirmation"),
    ],
)
def test_bad_or_mistyped_passwords_create_no_account(client, lab, password, again, words):
    _, manager, _ = lab
    client.force_login(manager)
    users = get_user_model().objects.count()
    response = _create(client, "newbie", password, again)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert get_user_model().objects.count() == users


def test_a_role_change_is_confirmed_before_it_happens(client, lab):
    _, manager, researcher = lab
    client.force_login(manager)
    url = reverse("team_member_role")
    first = client.post(url, {"username": researcher.username, "role": "manager"})
    assert first.status_code == 200
    assert b"Confirm" in first.content
    assert Membership.objects.get(user=researcher).role == "researcher"
    done = client.post(url, {"username": researcher.username, "role": "manager", "confirm": "1"})
    assert done.status_code == 302
    assert Membership.objects.get(user=researcher).role == "manager"


def test_the_last_manager_cannot_be_demoted_or_removed(client, lab):
    tenant, manager, researcher = lab
    client.force_login(manager)
    demote = client.post(
        reverse("team_member_role"),
        {"username": manager.username, "role": "researcher", "confirm": "1"},
        follow=True,
    )
    assert "last manager" in demote.content.decode()
    remove = client.post(
        reverse("team_member_remove"), {"username": manager.username, "confirm": "1"}, follow=True
    )
    assert "last manager" in remove.content.decode()
    assert Membership.objects.get(user=manager).role == "manager"
    # With a second manager, the first may step down, and a researcher may be removed.
    client.post(
        reverse("team_member_role"),
        {"username": researcher.username, "role": "manager", "confirm": "1"},
    )
    client.post(
        reverse("team_member_role"),
        {"username": manager.username, "role": "researcher", "confirm": "1"},
    )
    assert Membership.objects.get(user=manager).role == "researcher"
    assert Membership.objects.filter(tenant=tenant, role="manager").count() == 1


def test_a_member_is_removed_after_confirmation_and_audited(client, lab):
    tenant, manager, researcher = lab
    client.force_login(manager)
    url = reverse("team_member_remove")
    first = client.post(url, {"username": researcher.username})
    assert first.status_code == 200 and b"Confirm" in first.content
    assert Membership.objects.filter(user=researcher, tenant=tenant).exists()
    client.post(url, {"username": researcher.username, "confirm": "1"})
    assert not Membership.objects.filter(user=researcher).exists()
    researcher.refresh_from_db()
    assert not researcher.is_active  # a removed member can no longer sign in
    assert AuditEvent.objects.filter(action="membership.remove").exists()
