"""Admin: pages render, and every write goes through the services (a policy change is a new
version; the one opened stays as it was)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from market.models import PolicyVersion, Tier
from market.services.policy import policy_version_create
from market.services.tick import round_process

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, market):
    client.force_login(market.admin)
    return client


def test_every_market_admin_page_renders(admin_client, market):
    round_process(round_id=market.round.pk, now=market.after_close())
    for name in ("tier", "policyversion", "round", "bid", "allocation"):
        assert admin_client.get(reverse(f"admin:market_{name}_changelist")).status_code == 200
    assert (
        admin_client.get(reverse("admin:market_round_change", args=[market.round.pk])).status_code
        == 200
    )
    # A policy version's change page is the staff form (see below).


def test_policy_versions_are_edited_on_the_one_staff_form(admin_client, market):
    # The admin lists versions and runs the actions; creating and editing go to the policy
    # pages' form (tested in test_policy_views), so there is one form to keep right.
    change = reverse("admin:market_policyversion_change", args=[market.policy.pk])
    response = admin_client.get(change)
    assert response.status_code == 302
    assert response["Location"] == f"/market/policy/v{market.policy.number}/edit/"
    response = admin_client.post(change, {"round_minutes": 30})
    assert response["Location"] == f"/market/policy/v{market.policy.number}/edit/"
    assert PolicyVersion.objects.count() == 1  # nothing was written by the admin
    add = admin_client.get(reverse("admin:market_policyversion_add"))
    assert (add.status_code, add["Location"]) == (302, "/market/policy/new/")
    listing = admin_client.get(reverse("admin:market_policyversion_changelist"))
    assert listing.status_code == 200


def test_activate_action_goes_through_the_service(admin_client, market):
    draft = policy_version_create(actor=market.admin, mechanism="maxmin")
    response = admin_client.post(
        reverse("admin:market_policyversion_changelist"),
        {"action": "activate", "_selected_action": [draft.pk]},
    )
    assert response.status_code == 302
    assert dict(PolicyVersion.objects.values_list("number", "status")) == {
        1: "retired",
        2: "active",
    }
    assert AuditEvent.objects.filter(action="policy.activate").count() == 2


def test_tiers_are_created_and_changed_through_the_services(admin_client, settings):
    # Without the two-person rule for tier changes (under it the admin shows the GPUs read
    # only: tests/governance/test_approvals.py).
    settings.GPUMARKET_APPROVALS = {"policy_activate": {}}
    data = {
        "slug": "l40s",
        "name": "L40S",
        "gpu_model": "",
        "capacity": 6,
        "maintenance_gpus": 0,
        "active": "on",
    }
    assert admin_client.post(reverse("admin:market_tier_add"), data).status_code == 302
    tier = Tier.objects.get(slug="l40s")
    assert AuditEvent.objects.filter(action="tier.create", object_id=str(tier.pk)).exists()
    change = data | {"capacity": 4, "maintenance_gpus": 1}
    assert (
        admin_client.post(reverse("admin:market_tier_change", args=[tier.pk]), change).status_code
        == 302
    )
    tier.refresh_from_db()
    assert (tier.capacity, tier.offered) == (4, 3)
    assert AuditEvent.objects.filter(action="tier.update", object_id=str(tier.pk)).count() == 1


def test_rounds_bids_and_allocations_are_read_only(admin_client, market):
    assert admin_client.get(reverse("admin:market_round_add")).status_code == 403
    assert admin_client.get(reverse("admin:market_bid_add")).status_code == 403


def test_the_add_tier_page_renders(admin_client):
    assert admin_client.get(reverse("admin:market_tier_add")).status_code == 200
