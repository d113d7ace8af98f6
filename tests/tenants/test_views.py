"""Tenant pages: dashboard, team management (managers only), credits and budgets (staff only)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from tenants.ledger import balance_get
from tenants.models import Budget, Campaign, Membership, Notification
from tests import factories

pytestmark = pytest.mark.django_db


def test_dashboard_requires_login(client):
    response = client.get(reverse("dashboard"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_dashboard_shows_credits_budget_and_only_own_notifications(client, lab):
    tenant, _manager, researcher = lab
    other = factories.tenant(name="Speech Lab")
    Notification.objects.create(tenant=tenant, kind="budget", message="Monthly budget at 80%")
    Notification.objects.create(tenant=other, kind="budget", message="Speech secret alert")
    from tenants.budgets import budget_set

    budget_set(tenant=tenant, window="month", mode="soft", cap=40_000, actor=None)
    client.force_login(researcher)
    response = client.get(reverse("dashboard"))
    body = response.content.decode()
    assert 'data-testid="available">100.000<' in body
    assert "Monthly budget at 80%" in body
    assert "Speech secret alert" not in body
    assert "40.000" in body  # the cap
    assert reverse("allocations_live") in body  # the live panel's htmx source


def test_navigation_follows_role(client, lab):
    _tenant, manager, researcher = lab
    client.force_login(researcher)
    body = client.get(reverse("dashboard")).content.decode()
    assert reverse("bid_new") in body and reverse("team_members") not in body
    assert reverse("audit_review") not in body
    client.force_login(manager)
    assert reverse("team_members") in client.get(reverse("dashboard")).content.decode()
    client.force_login(factories.admin_user())
    body = client.get(reverse("dashboard")).content.decode()
    assert reverse("audit_review") in body and 'href="/market/policy/"' in body


def test_researcher_cannot_manage_team(client, lab):
    _tenant, _manager, researcher = lab
    client.force_login(researcher)
    assert client.get(reverse("team_members")).status_code == 403
    response = client.post(reverse("team_members"), {"username": "mallory", "role": "manager"})
    assert response.status_code == 403
    assert not Membership.objects.filter(user__username="mallory").exists()


def test_manager_adds_member_and_changes_role(client, lab):
    tenant, manager, researcher = lab
    client.force_login(manager)
    response = client.post(
        reverse("team_members"),
        {
            "username": "newbie",
            "role": "researcher",
            "password1": "pw-newbie-long-1",
            "password2": "pw-newbie-long-1",
        },
    )
    assert response.status_code == 302
    assert Membership.objects.get(user__username="newbie").tenant == tenant
    client.post(
        reverse("team_member_role"),
        {"username": researcher.username, "role": "manager", "confirm": "1"},
    )
    assert Membership.objects.get(user=researcher).role == "manager"
    assert (
        AuditEvent.objects.filter(
            action__in=["membership.create", "membership.set"], actor_label=manager.username
        ).count()
        == 2
    )


def test_manager_cannot_take_another_tenants_member(client, lab):
    _tenant, manager, _researcher = lab
    other = factories.tenant(name="Speech Lab")
    outsider = factories.member(tenant=other)
    client.force_login(manager)
    response = client.post(
        reverse("team_members"),
        {
            "username": outsider.username,
            "role": "manager",
            "password1": "pw-outsider-long-1",
            "password2": "pw-outsider-long-1",
        },
    )
    assert response.status_code == 400
    assert b"is taken" in response.content
    client.post(
        reverse("team_member_role"),
        {"username": outsider.username, "role": "manager", "confirm": "1"},
    )
    assert Membership.objects.get(user=outsider).tenant == other
    assert Membership.objects.get(user=outsider).role == "researcher"


def test_manager_creates_campaign_and_cap_with_inline_errors(client, lab):
    tenant, manager, _ = lab
    client.force_login(manager)
    bad = client.post(
        reverse("team_campaigns"),
        {"name": "ICML", "starts_at": "2030-02-01T00:00", "ends_at": "2030-01-01T00:00"},
    )
    assert bad.status_code == 400
    assert b"must end after it starts" in bad.content
    ok = client.post(
        reverse("team_campaigns"),
        {"name": "ICML", "starts_at": "2030-01-01T00:00", "ends_at": "2030-02-01T00:00"},
    )
    assert ok.status_code == 302
    campaign = Campaign.objects.get(tenant=tenant, name="ICML")
    response = client.post(
        reverse("team_budget_set"),
        {"window": "campaign", "mode": "hard", "cap": "250.5", "campaign": campaign.pk},
    )
    assert response.status_code == 302
    assert Budget.objects.get(tenant=tenant, campaign=campaign).cap == 250_500
    bad_cap = client.post(
        reverse("team_budget_set"), {"window": "month", "mode": "safe", "cap": "1.2345"}
    )
    assert bad_cap.status_code == 400
    assert b"at most three decimals" in bad_cap.content


def test_manager_cannot_use_another_tenants_campaign(client, lab):
    tenant, manager, _ = lab
    other = factories.tenant(name="Speech Lab")
    from datetime import UTC, datetime

    from tenants.budgets import campaign_create

    foreign = campaign_create(
        tenant=other,
        name="Theirs",
        starts_at=datetime(2030, 1, 1, tzinfo=UTC),
        ends_at=datetime(2030, 2, 1, tzinfo=UTC),
        actor=None,
    )
    client.force_login(manager)
    page = client.get(reverse("team_campaigns")).content.decode()
    assert "Theirs" not in page
    response = client.post(
        reverse("team_budget_set"),
        {"window": "campaign", "mode": "safe", "cap": "5", "campaign": foreign.pk},
    )
    assert response.status_code == 400
    assert not Budget.objects.filter(campaign=foreign).exists()


@pytest.mark.parametrize("name", ["staff_tenants", "staff_credits", "staff_budgets"])
def test_staff_pages_are_staff_only(client, lab, name):
    _tenant, manager, _ = lab
    assert client.get(reverse(name)).status_code == 302
    client.force_login(manager)
    assert client.get(reverse(name)).status_code == 403
    assert client.post(reverse(name), {}).status_code == 403


def test_staff_grants_credits_with_reason(client, lab):
    tenant, _, _ = lab
    admin = factories.admin_user()
    client.force_login(admin)
    missing_reason = client.post(
        reverse("staff_credits"), {"tenant": tenant.pk, "amount": "10", "reason": ""}
    )
    assert missing_reason.status_code == 400
    assert b"This field is required" in missing_reason.content
    assert balance_get(tenant=tenant).available == 100_000
    response = client.post(
        reverse("staff_credits"), {"tenant": tenant.pk, "amount": "12.5", "reason": "Q3 allocation"}
    )
    assert response.status_code == 302
    assert balance_get(tenant=tenant).available == 112_500
    assert b"Q3 allocation" in client.get(reverse("staff_credits")).content


def test_staff_sets_budget_and_creates_tenant(client, lab):
    tenant, _, _ = lab
    client.force_login(factories.admin_user())
    response = client.post(
        reverse("staff_budgets"),
        {"tenant": tenant.pk, "window": "day", "mode": "hard", "cap": "30"},
    )
    assert response.status_code == 302
    assert Budget.objects.get(tenant=tenant, window="day").cap == 30_000
    response = client.post(reverse("staff_tenants"), {"name": "Robotics", "weight": "2"})
    assert response.status_code == 302
    duplicate = client.post(reverse("staff_tenants"), {"name": "Robotics", "weight": "2"})
    assert duplicate.status_code == 400
    assert b"already exists" in duplicate.content


def test_every_form_carries_a_csrf_token(client, lab):
    _tenant, manager, _ = lab
    client.force_login(manager)
    for name in ("team_members", "team_campaigns"):
        body = client.get(reverse(name)).content.decode()
        assert body.count("<form") == body.count("csrfmiddlewaretoken")


def test_admin_grant_page_uses_the_staff_grant_form(client, lab):
    """The tenant's admin page grants through the same form as the staff credits page: credits
    with decimals, a required reason, the tenant given by the page."""
    tenant, _, _ = lab
    client.force_login(factories.admin_user())
    url = reverse("admin:tenants_tenant_grant", args=[tenant.pk])
    assert client.post(url, {"amount": "3", "reason": ""}).status_code == 200  # form errors
    assert balance_get(tenant=tenant).available == 100_000
    response = client.post(url, {"amount": "2.5", "reason": "pilot"})
    assert response.status_code == 302
    assert balance_get(tenant=tenant).available == 102_500


def test_the_admin_grant_page_of_a_missing_tenant_is_a_404(client, lab):
    tenant, _, _ = lab
    client.raise_request_exception = False
    client.force_login(factories.admin_user())
    url = reverse("admin:tenants_tenant_grant", args=[tenant.pk + 1000])
    assert client.get(url).status_code == 404
    assert client.post(url, {"amount": "3", "reason": "x"}).status_code == 404


def test_403_and_404_pages_are_the_sites_own_and_say_what_happened(client, lab, settings):
    _, _, researcher = lab
    settings.DEBUG = False
    client.force_login(researcher)
    missing = client.get("/market/bids/999999/")
    assert missing.status_code == 404
    assert "Not found" in missing.content.decode() and "Back to the dashboard" in (
        missing.content.decode()
    )
    forbidden = client.get(reverse("team_members"))
    assert forbidden.status_code == 403
    body = forbidden.content.decode()
    assert "Not allowed" in body and "Only the team" in body and "managers can manage" in body
    assert "gpumarket" in body  # the site's layout, not a bare error


def test_a_manager_tightens_a_cap_the_platform_set_but_never_loosens_it(client, lab):
    # The platform's caps are under the two-person rule for raises; the team's manager must
    # not raise one alone from the team's page. Caps the manager set stay the team's own.
    from tenants.budgets import budget_set

    tenant, manager, _ = lab
    admin = factories.admin_user(username="ops")
    budget_set(tenant=tenant, window="month", mode="hard", cap=5_000_000, actor=admin)
    client.force_login(manager)
    events = AuditEvent.objects.filter(action="budget.set").count()
    for loosen in ({"mode": "hard", "cap": "6000"}, {"mode": "soft", "cap": "5000"}):
        refused = client.post(reverse("team_budget_set"), {"window": "month", **loosen})
        assert refused.status_code == 400
        assert "set by a platform admin" in refused.content.decode()
    budget = Budget.objects.get(tenant=tenant, window="month")
    assert (budget.mode, budget.cap) == ("hard", 5_000_000)
    assert AuditEvent.objects.filter(action="budget.set").count() == events
    lowered = client.post(
        reverse("team_budget_set"), {"window": "month", "mode": "safe", "cap": "4000"}
    )
    assert lowered.status_code == 302
    budget.refresh_from_db()
    assert (budget.mode, budget.cap) == ("safe", 4_000_000)
    # Lowered by the team, it is still the platform's cap: the manager cannot win it back.
    back = client.post(
        reverse("team_budget_set"), {"window": "month", "mode": "safe", "cap": "5000"}
    )
    assert back.status_code == 400
    # A cap the manager set is the team's own to raise.
    own = {"window": "week", "mode": "hard"}
    assert client.post(reverse("team_budget_set"), {**own, "cap": "100"}).status_code == 302
    assert client.post(reverse("team_budget_set"), {**own, "cap": "900"}).status_code == 302
    assert Budget.objects.get(tenant=tenant, window="week").cap == 900_000
