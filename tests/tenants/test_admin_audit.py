"""The Django admin writes nothing around the services: budgets and campaigns are read-only
there (their pages use the services), tenants change only through their pages, and every
change of a user's is_staff, is_superuser or is_active is an audit event."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.models import AuditEvent
from tenants.budgets import budget_set, campaign_create
from tenants.models import Budget, Campaign, Membership, Tenant
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(factories.admin_user())
    return client


def test_a_budget_cannot_be_changed_in_the_admin(admin_client):
    tenant = factories.tenant()
    budget = budget_set(tenant=tenant, window="day", mode="hard", cap=10_000, actor=None)
    response = admin_client.post(
        f"/admin/tenants/budget/{budget.pk}/change/",
        {"tenant": tenant.pk, "window": "day", "mode": "soft", "cap": 999_999_000, "active": "on"},
    )
    assert response.status_code == 403
    budget.refresh_from_db()
    assert (budget.mode, budget.cap) == ("hard", 10_000)
    assert admin_client.get("/admin/tenants/budget/add/").status_code == 403


def test_a_campaign_cannot_be_changed_in_the_admin(admin_client):
    tenant = factories.tenant()
    now = timezone.now()
    campaign = campaign_create(
        tenant=tenant,
        name="sprint",
        starts_at=now,
        ends_at=now + timezone.timedelta(days=1),
        actor=None,
    )
    response = admin_client.post(
        f"/admin/tenants/campaign/{campaign.pk}/change/",
        {"tenant": tenant.pk, "name": "renamed", "starts_at_0": "2030-01-01"},
    )
    assert response.status_code == 403
    assert Campaign.objects.get(pk=campaign.pk).name == "sprint"


def test_a_tenant_change_in_the_admin_is_refused_not_a_500(admin_client):
    tenant = factories.tenant(name="Vision")
    member = factories.member(tenant=tenant)
    response = admin_client.post(
        f"/admin/tenants/tenant/{tenant.pk}/change/",
        {
            "name": "Vision",
            "slug": tenant.slug,
            "weight": 50,
            "memberships-TOTAL_FORMS": "1",
            "memberships-INITIAL_FORMS": "1",
            "memberships-0-id": Membership.objects.get(user=member).pk,
            "memberships-0-tenant": tenant.pk,
            "memberships-0-user": member.pk,
            "memberships-0-role": "manager",
        },
    )
    assert response.status_code == 403
    tenant.refresh_from_db()
    assert tenant.weight == 1
    assert Membership.objects.get(user=member).role == "researcher"
    assert admin_client.get(f"/admin/tenants/tenant/{tenant.pk}/change/").status_code == 200


def _user_change(admin_client, user, **flags):
    data = {
        "username": user.username,
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    data.update({name: "on" for name, value in flags.items() if value})
    return admin_client.post(f"/admin/auth/user/{user.pk}/change/", data)


def test_making_a_user_superuser_in_the_admin_is_audited(admin_client):
    user = get_user_model().objects.create_user("plain", password="x-plain-password-1")
    response = _user_change(admin_client, user, is_active=True, is_staff=True, is_superuser=True)
    assert response.status_code == 302, response.content[:2000]
    user.refresh_from_db()
    assert user.is_superuser and user.is_staff
    event = AuditEvent.objects.filter(action="user.flags", object_id=str(user.pk)).latest("seq")
    assert event.before == {"is_active": True, "is_staff": False, "is_superuser": False}
    assert event.after == {"is_active": True, "is_staff": True, "is_superuser": True}
    assert event.actor_label != "system"


def test_a_flag_change_made_outside_the_admin_is_audited_too():
    user = get_user_model().objects.create_user("quiet", password="x-quiet-password-1")
    user.is_active = False
    user.save()
    event = AuditEvent.objects.filter(action="user.flags", object_id=str(user.pk)).latest("seq")
    assert event.after["is_active"] is False and event.before["is_active"] is True
    user.first_name = "Q"
    user.save()
    assert AuditEvent.objects.filter(action="user.flags", object_id=str(user.pk)).count() == 1
    assert Tenant.objects.count() >= 0 and Budget.objects.count() == 0
