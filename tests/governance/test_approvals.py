"""The two-person rule: requested with a justification, decided by someone else, applied once
in the approval's transaction, expired if left; each step audited with both names."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from audit.models import AuditEvent
from governance.errors import GovernanceError
from governance.models import ChangeRequest
from governance.rules import approval_needed
from governance.services import (
    change_approve,
    change_reject,
    change_request,
    change_withdraw,
    changes_expire,
)
from market.models import PolicyVersion, Tier
from market.services.policy import policy_version_create
from tenants.budgets import budget_set
from tenants.ledger import balance_get
from tenants.models import Budget, Transfer
from tests.governance.conftest import signed_in

pytestmark = pytest.mark.django_db

Status = ChangeRequest.Status
BIG = "20000"  # credits: above the default 10,000-credit threshold for grants


def _grant_request(world, *, amount=20_000_000, by=None):
    return change_request(
        kind="credit_grant",
        actor=by or world.admin,
        justification="Paper deadline: the vision team's allocation ran out.",
        payload={"tenant": world.vision.pk, "amount": amount, "reason": "deadline top-up"},
    )


# Through the staff pages -------------------------------------------------------------------


def test_a_large_grant_on_the_credits_page_waits_for_a_second_admin(world):
    client = signed_in(world.admin)
    grants = Transfer.objects.filter(kind="grant").count()
    response = client.post(
        "/staff/credits/", {"tenant": world.vision.pk, "amount": BIG, "reason": "deadline"}
    )
    assert response.status_code == 302
    assert response.url.startswith("/governance/new/credit_grant/?")
    assert Transfer.objects.filter(kind="grant").count() == grants
    form = client.get(response.url).content.decode()
    assert 'value="20000"' in form and "deadline" in form
    sent = client.post(
        "/governance/new/credit_grant/",
        {
            "tenant": world.vision.pk,
            "amount": BIG,
            "reason": "deadline",
            "justification": "The lab's paper is due on Friday.",
        },
    )
    assert sent.status_code == 302
    req = ChangeRequest.objects.get()
    assert req.status == Status.PENDING and req.payload["amount"] == 20_000_000
    assert Transfer.objects.filter(kind="grant").count() == grants


def test_a_small_grant_still_applies_at_once(world):
    before = balance_get(tenant=world.vision).available
    response = signed_in(world.admin).post(
        "/staff/credits/", {"tenant": world.vision.pk, "amount": "5", "reason": "small"}
    )
    assert response.status_code == 302 and response.url == "/staff/credits/"
    assert balance_get(tenant=world.vision).available == before + 5_000
    assert not ChangeRequest.objects.exists()


def test_approval_applies_the_grant_once_and_audits_both_people(world):
    req = _grant_request(world)
    before = balance_get(tenant=world.vision).available
    client = signed_in(world.second_admin)
    response = client.post(f"/governance/{req.pk}/approve/", {"note": "ok"}, follow=True)
    assert "approved and applied" in response.content.decode()
    assert balance_get(tenant=world.vision).available == before + 20_000_000
    req.refresh_from_db()
    assert req.status == Status.APPLIED and req.decided_by == world.second_admin
    asked = AuditEvent.objects.get(action="approval.request")
    assert asked.actor_label == "alice-admin"
    assert asked.after["justification"].startswith("Paper deadline")
    approved = AuditEvent.objects.get(action="approval.approve")
    assert approved.actor_label == "bob-admin"
    assert approved.after["requested_by"] == "alice-admin"
    assert approved.after["decided_by"] == "bob-admin"
    grant = AuditEvent.objects.filter(action="ledger.grant").last()
    assert grant.seq < approved.seq and grant.actor_label == "bob-admin"
    # Replayed: refused, and the credits moved once.
    again = client.post(f"/governance/{req.pk}/approve/", follow=True).content.decode()
    assert "already approved and applied by bob-admin" in again
    assert balance_get(tenant=world.vision).available == before + 20_000_000


def test_the_requester_cannot_approve_or_reject_their_own_request(world):
    req = _grant_request(world)
    with pytest.raises(GovernanceError, match="another administrator must decide"):
        change_approve(pk=req.pk, actor=world.admin)
    with pytest.raises(GovernanceError, match="another administrator must decide"):
        change_reject(pk=req.pk, actor=world.admin, note="never mind")
    body = signed_in(world.admin).post(f"/governance/{req.pk}/approve/", follow=True)
    assert "another administrator must decide" in body.content.decode()
    req.refresh_from_db()
    assert req.status == Status.PENDING


def test_rejection_needs_a_note_and_a_rejected_request_is_never_applied(world):
    req = _grant_request(world)
    with pytest.raises(GovernanceError, match="note"):
        change_reject(pk=req.pk, actor=world.second_admin, note=" ")
    change_reject(pk=req.pk, actor=world.second_admin, note="Ask the dean first.")
    event = AuditEvent.objects.get(action="approval.reject")
    assert event.after["requested_by"] == "alice-admin"
    assert event.after["decided_by"] == "bob-admin"
    with pytest.raises(GovernanceError, match="already rejected"):
        change_approve(pk=req.pk, actor=world.second_admin)
    assert not Transfer.objects.filter(reason__contains="change request").exists()


def test_an_expired_request_is_refused_and_beat_marks_it(world):
    req = _grant_request(world)
    later = req.expires_at + timedelta(seconds=1)
    with pytest.raises(GovernanceError, match="expired"):
        change_approve(pk=req.pk, actor=world.second_admin, now=later)
    assert changes_expire(now=later) == 1
    req.refresh_from_db()
    assert req.status == Status.EXPIRED
    event = AuditEvent.objects.get(action="approval.expire")
    assert event.actor_label == "beat" and event.after["requested_by"] == "alice-admin"
    assert changes_expire(now=later) == 0
    with pytest.raises(GovernanceError, match="already expired"):
        change_approve(pk=req.pk, actor=world.second_admin, now=later)


def test_an_auditor_or_a_manager_cannot_decide(world):
    req = _grant_request(world)
    for user in (world.auditor, world.vision_manager):
        with pytest.raises(GovernanceError, match="Only platform administrators"):
            change_approve(pk=req.pk, actor=user)


def test_a_request_needs_a_justification_and_names_the_bad_field(world):
    with pytest.raises(GovernanceError, match="justification"):
        change_request(kind="credit_grant", actor=world.admin, justification=" ", payload={})
    with pytest.raises(GovernanceError, match="amount"):
        change_request(
            kind="credit_grant",
            actor=world.admin,
            justification="why",
            payload={"tenant": world.vision.pk, "amount": -5, "reason": "x"},
        )
    response = signed_in(world.admin).post(
        "/governance/new/credit_grant/", {"tenant": world.vision.pk, "amount": "x"}
    )
    assert response.status_code == 400
    assert not ChangeRequest.objects.exists()


# Policy, tiers, budgets, weights -----------------------------------------------------------


def test_policy_activation_waits_for_approval(world):
    draft = policy_version_create(actor=world.admin, based_on=None, mechanism="fisher")
    client = signed_in(world.admin)
    response = client.post(f"/market/policy/v{draft.number}/activate/", {"confirm": "1"})
    assert response.status_code == 302
    assert response.url == f"/governance/new/policy_activate/?version={draft.number}"
    draft.refresh_from_db()
    assert draft.status == PolicyVersion.Status.DRAFT
    client.post(
        "/governance/new/policy_activate/",
        {"version": draft.number, "justification": "Fisher was better in replay."},
    )
    req = ChangeRequest.objects.get(kind="policy_activate")
    change_approve(pk=req.pk, actor=world.second_admin)
    draft.refresh_from_db()
    assert draft.status == PolicyVersion.Status.ACTIVE


def test_a_tier_capacity_change_waits_and_other_fields_apply(world):
    tier = world.tier
    client = signed_in(world.admin)
    prefix = f"t{tier.pk}"
    response = client.post(
        f"/market/admin/tiers/{tier.pk}/",
        {
            f"{prefix}-name": "A100 80GB",
            f"{prefix}-gpu_model": "A100",
            f"{prefix}-capacity": 8,
            f"{prefix}-maintenance_gpus": 2,
            f"{prefix}-active": "on",
        },
    )
    assert response.status_code == 302 and "/governance/new/tier_change/" in response.url
    tier.refresh_from_db()
    assert tier.name == "A100 80GB" and tier.maintenance_gpus == 0
    req = change_request(
        kind="tier_change",
        actor=world.admin,
        justification="Two GPUs go for repair.",
        payload={"tier": tier.pk, "capacity": 8, "maintenance_gpus": 2},
    )
    change_approve(pk=req.pk, actor=world.second_admin)
    tier.refresh_from_db()
    assert tier.maintenance_gpus == 2


def test_the_tier_admin_cannot_change_gpus_alone_under_the_rule(world, settings):
    tier = world.tier
    client = signed_in(world.admin)
    page = client.get(f"/admin/market/tier/{tier.pk}/change/")
    assert page.status_code == 200
    assert b'name="capacity"' not in page.content
    assert b'name="maintenance_gpus"' not in page.content
    response = client.post(
        f"/admin/market/tier/{tier.pk}/change/",
        {
            "name": "A100 renamed",
            "gpu_model": tier.gpu_model,
            "capacity": tier.capacity + 8,
            "maintenance_gpus": 3,
            "active": "on",
            "preemptible": "",
        },
    )
    assert response.status_code in (200, 302)
    tier.refresh_from_db()
    assert tier.maintenance_gpus == 0 and tier.capacity != 16  # unchanged by the admin page
    # With the rule off for tier changes, the admin edits the GPUs directly again; raising
    # the capacity above what the nodes report is refused on the page, not a 500.
    settings.GPUMARKET_APPROVALS = {"policy_activate": {}}
    url = f"/admin/market/tier/{tier.pk}/change/"
    assert b'name="maintenance_gpus"' in client.get(url).content
    form = {"name": "A100", "gpu_model": tier.gpu_model, "active": "on", "preemptible": ""}
    raised = client.post(url, {**form, "capacity": tier.capacity + 8, "maintenance_gpus": 0})
    assert raised.status_code == 302 and raised.url == url
    assert "cannot be raised by hand" in client.get(url).content.decode()
    lowered = client.post(url, {**form, "capacity": tier.capacity, "maintenance_gpus": 1})
    assert lowered.status_code == 302
    tier.refresh_from_db()
    assert tier.maintenance_gpus == 1


def test_an_approval_of_a_change_whose_starting_point_moved_is_refused(world):
    req = change_request(
        kind="tier_change",
        actor=world.admin,
        justification="Two GPUs go for repair.",
        payload={"tier": world.tier.pk, "capacity": 8, "maintenance_gpus": 2},
    )
    Tier.objects.filter(pk=world.tier.pk).update(capacity=6)
    with pytest.raises(GovernanceError, match="changed since this request"):
        change_approve(pk=req.pk, actor=world.second_admin)
    req.refresh_from_db()
    assert req.status == Status.PENDING
    assert not AuditEvent.objects.filter(action="approval.approve").exists()


def test_a_large_budget_raise_waits_and_a_cut_does_not(world):
    budget_set(tenant=world.vision, window="month", mode="hard", cap=1_000_000, actor=world.admin)
    client = signed_in(world.admin)
    form = {"tenant": world.vision.pk, "window": "month", "mode": "hard"}
    cut = client.post("/staff/budgets/", {**form, "cap": "500"})
    assert cut.status_code == 302 and cut.url == "/staff/budgets/"
    raised = client.post("/staff/budgets/", {**form, "cap": "9000"})
    assert "/governance/new/budget_raise/" in raised.url
    assert Budget.objects.get(tenant=world.vision, active=True).cap == 500_000
    req = change_request(
        kind="budget_raise",
        actor=world.admin,
        justification="Grant renewed.",
        payload={**form, "cap": 9_000_000, "campaign": None},
    )
    change_approve(pk=req.pk, actor=world.second_admin)
    assert Budget.objects.get(tenant=world.vision, active=True).cap == 9_000_000


def test_a_tenant_weight_changes_only_through_an_approved_request(world):
    client = signed_in(world.admin)
    response = client.post(
        "/governance/new/tenant_weight/",
        {"tenant": world.speech.pk, "weight": 3, "justification": "Two new groups joined."},
    )
    assert response.status_code == 302
    world.speech.refresh_from_db()
    assert world.speech.weight == 1
    req = ChangeRequest.objects.get(kind="tenant_weight")
    change_approve(pk=req.pk, actor=world.second_admin)
    world.speech.refresh_from_db()
    assert world.speech.weight == 3
    event = AuditEvent.objects.get(action="tenant.weight")
    assert event.before == {"weight": 1} and event.after == {"weight": 3}


# The rule is configurable --------------------------------------------------------------------


def test_a_kind_left_out_of_the_rule_applies_at_once_and_is_recorded(world, settings):
    settings.GPUMARKET_APPROVALS = {"policy_activate": {}}
    assert not approval_needed("credit_grant", amount=10**9)
    req = _grant_request(world)
    assert req.status == Status.APPLIED and not req.needed_approval
    assert AuditEvent.objects.filter(action="approval.apply").exists()
    response = signed_in(world.admin).post(
        "/staff/credits/", {"tenant": world.vision.pk, "amount": BIG, "reason": "direct"}
    )
    assert response.url == "/staff/credits/"


def test_thresholds_come_from_settings_and_bad_rules_are_refused(settings):
    settings.GPUMARKET_APPROVALS = {"credit_grant": {"above_credits": 100}}
    assert not approval_needed("credit_grant", amount=100_000)
    assert approval_needed("credit_grant", amount=100_001)
    assert approval_needed("team_credits", amount=1)
    for bad in ({"nonsense": {}}, {"tier_change": {"above_credits": 5}}, {"credit_grant": 3}):
        settings.GPUMARKET_APPROVALS = bad
        with pytest.raises(ImproperlyConfigured):
            approval_needed("credit_grant", amount=1)


# Managers ask for their team's credits -------------------------------------------------------


def test_a_manager_asks_for_credits_and_an_admin_grants_them(world):
    manager = signed_in(world.vision_manager)
    response = manager.post(
        "/governance/team/",
        {"amount": "300", "reason": "ablation runs", "justification": "Reviewer asked."},
    )
    assert response.status_code == 302
    req = ChangeRequest.objects.get(kind="team_credits")
    assert req.tenant == world.vision and req.requested_by == world.vision_manager
    assert "ablation runs" in manager.get("/governance/team/").content.decode()
    # Another team's manager sees none of it.
    assert (
        "ablation" not in signed_in(world.speech_manager).get("/governance/team/").content.decode()
    )
    before = balance_get(tenant=world.vision).available
    change_approve(pk=req.pk, actor=world.admin)
    assert balance_get(tenant=world.vision).available == before + 300_000
    body = manager.get("/governance/team/").content.decode()
    assert "Approved and applied" in body and "alice-admin" in body


def test_a_manager_asks_only_for_their_own_team(world):
    with pytest.raises(GovernanceError, match="only the team's own manager"):
        change_request(
            kind="team_credits",
            actor=world.vision_manager,
            justification="x",
            payload={"tenant": world.speech.pk, "amount": 1_000, "reason": "x"},
        )
    assert signed_in(world.vision_researcher).get("/governance/team/").status_code == 403
    with pytest.raises(GovernanceError, match="Only platform administrators"):
        _grant_request(world, by=world.vision_manager)


# The API ---------------------------------------------------------------------------------------


def test_the_api_requests_lists_and_decides(world):
    admin = signed_in(world.admin)
    created = admin.post(
        "/api/v1/approvals",
        {
            "kind": "credit_grant",
            "justification": "Deadline.",
            "change": {"tenant": world.vision.pk, "amount": "20000", "reason": "top-up"},
        },
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "pending" and body["change"]["amount"] == "20000.000"
    pk = body["id"]
    own = admin.post(f"/api/v1/approvals/{pk}/approve", {}, content_type="application/json")
    assert own.status_code == 409
    assert "another administrator" in own.json()["error"]["message"]
    other = signed_in(world.second_admin)
    ok = other.post(f"/api/v1/approvals/{pk}/approve", {}, content_type="application/json")
    assert ok.status_code == 200 and ok.json()["decided_by"] == "bob-admin"
    replay = other.post(f"/api/v1/approvals/{pk}/approve", {}, content_type="application/json")
    assert replay.status_code == 409
    bad = admin.post(
        "/api/v1/approvals",
        {"kind": "credit_grant", "justification": "x", "change": {"amount": "1e3"}},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "change.amount" in bad.json()["error"]["fields"]
    manager = signed_in(world.speech_manager)
    assert manager.get("/api/v1/approvals").json()["count"] == 0
    assert manager.get(f"/api/v1/approvals/{pk}").status_code == 404
    assert signed_in(world.vision_manager).get("/api/v1/approvals").json()["count"] == 1
    researcher = signed_in(world.vision_researcher)
    assert researcher.get("/api/v1/approvals").json()["count"] == 0
    assert researcher.get(f"/api/v1/approvals/{pk}").status_code == 404
    refused = researcher.post(
        "/api/v1/approvals",
        {"kind": "credit_grant", "justification": "x", "change": {}},
        content_type="application/json",
    )
    assert refused.status_code == 403


def test_the_admin_grant_page_asks_for_approval_too(world):
    before = balance_get(tenant=world.vision).available
    response = signed_in(world.admin).post(
        f"/admin/tenants/tenant/{world.vision.pk}/grant/", {"amount": BIG, "reason": "admin"}
    )
    assert response.status_code == 302
    assert response.url.startswith("/governance/new/credit_grant/?")
    assert balance_get(tenant=world.vision).available == before


# Withdrawing one's own request --------------------------------------------------------------


def test_the_requester_withdraws_a_pending_request_on_the_page_and_it_never_applies(world):
    req = _grant_request(world)
    before = balance_get(tenant=world.vision).available
    client = signed_in(world.admin)
    assert f"/governance/{req.pk}/withdraw/" in client.get("/governance/").content.decode()
    response = client.post(f"/governance/{req.pk}/withdraw/")
    assert response.status_code == 302
    req.refresh_from_db()
    assert req.status == Status.WITHDRAWN and req.decided_by is None and req.decided_at
    event = AuditEvent.objects.get(action="approval.withdraw", object_id=str(req.pk))
    assert event.actor_label == "alice-admin" and event.after["status"] == "withdrawn"
    with pytest.raises(GovernanceError, match="already withdrawn"):
        change_approve(pk=req.pk, actor=world.second_admin)
    assert balance_get(tenant=world.vision).available == before


def test_only_the_requester_withdraws_and_only_while_it_waits(world):
    req = _grant_request(world)
    for other in (world.second_admin, world.vision_manager, world.auditor):
        with pytest.raises(GovernanceError, match="alice-admin asked for change request"):
            change_withdraw(pk=req.pk, actor=other)
    assert signed_in(world.second_admin).post(f"/governance/{req.pk}/withdraw/").status_code == 302
    req.refresh_from_db()
    assert req.status == Status.PENDING
    change_approve(pk=req.pk, actor=world.second_admin)
    with pytest.raises(GovernanceError, match="already approved and applied"):
        change_withdraw(pk=req.pk, actor=world.admin)
    assert not AuditEvent.objects.filter(action="approval.withdraw").exists()


def test_a_manager_withdraws_the_teams_credit_request_on_the_team_page_and_by_the_api(world):
    ask = {"amount": "300", "reason": "ablation", "justification": "A second seed for it."}
    client = signed_in(world.vision_manager)
    assert client.post("/governance/team/", ask).status_code == 302
    first = ChangeRequest.objects.get()
    page = client.get("/governance/team/").content.decode()
    assert f"/governance/{first.pk}/withdraw/" in page
    assert client.post(f"/governance/{first.pk}/withdraw/").url == "/governance/team/"
    first.refresh_from_db()
    assert first.status == Status.WITHDRAWN
    second = change_request(
        kind="team_credits", actor=world.vision_manager, justification="again",
        payload={"tenant": world.vision.pk, "amount": 100_000, "reason": "ablation"},
    )  # fmt: skip
    url = f"/api/v1/approvals/{second.pk}/withdraw"
    answer = client.post(url, {}, content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "withdrawn"
    again = client.post(url, {}, content_type="application/json")
    assert again.status_code == 409 and "already withdrawn" in again.json()["error"]["message"]
