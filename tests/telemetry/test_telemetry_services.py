"""Node tokens, GPU maintenance, minute rollups and retention, the admin and the actions API."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit.models import AuditEvent
from telemetry.models import EnforcementAction, Gpu, IngestBatch, Node, Sample, SampleMinute
from telemetry.services import (
    enforce,
    gpu_maintenance_set,
    node_register,
    node_token_revoke,
    samples_ingest,
    samples_rollup,
)
from tests import factories
from tests.telemetry.batches import batch, post, process
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db


def test_token_is_stored_only_as_a_hash(node_token):
    node, token = node_token
    node.refresh_from_db()
    assert token not in {node.token_hash, node.token_prefix}
    assert node.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token.startswith(f"gmn_{node.token_prefix}_")
    assert AuditEvent.objects.filter(action="node.register", object_id=str(node.pk)).exists()
    assert token not in str(AuditEvent.objects.get(action="node.register").after)


def test_duplicate_node_name_is_refused(node_token, tier):
    from telemetry.errors import TelemetryError

    with pytest.raises(TelemetryError, match="already registered"):
        node_register(name="n1", tier=tier, actor="test")


def test_revoking_a_token_takes_its_gpus_out_of_capacity(client, node_token, tier):
    node, token = node_token
    post(client, token, batch(gpus=4))
    tier.refresh_from_db()
    assert tier.capacity == 4
    node_token_revoke(node=node, actor="test")
    tier.refresh_from_db()
    assert tier.capacity == 0
    assert AuditEvent.objects.filter(action="node.token_revoke").count() == 1


def test_maintenance_takes_a_gpu_out_of_capacity_and_back(client, node_token, tier):
    _, token = node_token
    post(client, token, batch(gpus=4))
    gpu = Gpu.objects.order_by("index").first()
    gpu_maintenance_set(gpu=gpu, maintenance=True, actor="test")
    tier.refresh_from_db()
    assert tier.capacity == 3
    post(client, token, batch(gpus=4))  # reporting does not undo maintenance
    tier.refresh_from_db()
    assert tier.capacity == 3
    gpu_maintenance_set(gpu=gpu, maintenance=False, actor="test")
    tier.refresh_from_db()
    assert tier.capacity == 4
    assert AuditEvent.objects.filter(action="gpu.maintenance").count() == 2
    assert AuditEvent.objects.filter(action="tier.update").count() >= 3


def test_rollup_folds_minutes_and_is_idempotent(node_token):
    node, _ = node_token
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    body = batch(gpus=1, ticks=90, at=minute + timedelta(seconds=89))
    for i, sample in enumerate(body["samples"]):
        sample["utilization_pct"] = i  # 0..89
        sample["energy_j"] = 10.0 * i
    samples_ingest(node=node, payload=body)

    result = samples_rollup()
    assert (result.batches, result.minutes) == (1, 2)
    first, second = SampleMinute.objects.order_by("minute")
    assert (first.minute, first.samples, first.utilization_avg, first.utilization_max) == (
        minute,
        60,
        29.5,
        59,
    )
    assert (second.samples, second.utilization_max, second.energy_j_last) == (30, 89, 890.0)
    assert samples_rollup().batches == 0
    assert SampleMinute.objects.count() == 2

    # A late batch (an agent's backlog) for the second minute: that minute is recomputed.
    late = batch(gpus=1, ticks=1, at=minute + timedelta(seconds=119))
    late["samples"][0]["utilization_pct"] = 100
    samples_ingest(node=node, payload=late)
    samples_rollup()
    second.refresh_from_db()
    assert (second.samples, second.utilization_max) == (31, 100)


def test_raw_samples_are_purged_after_retention_and_minutes_kept(node_token, settings):
    node, _ = node_token
    settings.GPUMARKET_SAMPLE_RETENTION_HOURS = 1
    samples_ingest(node=node, payload=batch(gpus=2, ticks=3))
    result = samples_rollup(now=timezone.now() + timedelta(hours=2))
    assert result.samples_purged == 6 and result.batches_purged == 1
    assert not Sample.objects.exists() and not IngestBatch.objects.exists()
    assert SampleMinute.objects.count() >= 2


def test_cli_registers_a_node_and_prints_its_token_once(tier):
    out, err = io.StringIO(), io.StringIO()
    call_command("node_register", "cli-node", "--tier", tier.slug, stdout=out, stderr=err)
    token = out.getvalue().strip()
    node = Node.objects.get(name="cli-node")
    assert node.token_hash == hashlib.sha256(token.encode()).hexdigest()


def test_admin_registers_a_node_and_shows_the_token_once(client, tier):
    client.force_login(factories.admin_user())
    response = client.post(
        "/admin/telemetry/node/add/", {"name": "admin-node", "tier": tier.pk}, follow=True
    )
    assert response.status_code == 200
    (message,) = [str(m) for m in response.context["messages"] if "Token for node" in str(m)]
    token = message.rsplit(" ", 1)[1]
    assert post(client, token, batch(node="admin-node")).status_code == 200
    assert Node.objects.get(name="admin-node").healthy


def test_admin_maintenance_action_goes_through_the_service(client, node_token, tier):
    _, token = node_token
    post(client, token, batch(gpus=2))
    client.force_login(factories.admin_user())
    gpu = Gpu.objects.order_by("index").first()
    client.post(
        "/admin/telemetry/gpu/",
        {"action": "maintenance_on", "_selected_action": [gpu.pk]},
        follow=True,
    )
    gpu.refresh_from_db()
    tier.refresh_from_db()
    assert gpu.maintenance and tier.capacity == 1
    assert AuditEvent.objects.filter(action="gpu.maintenance").exists()


def test_enforcement_actions_are_read_only_in_the_admin(client, node_token):
    node, _ = node_token
    samples_ingest(node=node, payload=batch(processes={0: [process(7)]}))
    (action,) = enforce().issued
    client.force_login(factories.admin_user())
    assert client.get(f"/admin/telemetry/enforcementaction/{action.pk}/change/").status_code == 200
    client.post(f"/admin/telemetry/enforcementaction/{action.pk}/change/", {"reason": "edited"})
    action.refresh_from_db()
    assert action.reason != "edited"
    assert client.get("/admin/telemetry/enforcementaction/add/").status_code == 403


def test_tenant_sees_its_own_enforcement_actions_only(client, node_token, tier):
    node, _ = node_token
    mine, theirs = factories.tenant(name="Mine"), factories.tenant(name="Theirs")
    now = timezone.now()
    upcoming = allocation_make(
        tenant=mine, tier=tier, starts_at=now + timedelta(hours=1), ends_at=now + timedelta(hours=2)
    )
    samples_ingest(node=node, payload=batch(processes={0: [process(7, allocation=upcoming.pk)]}))
    (action,) = enforce().issued

    client.force_login(factories.member(tenant=mine))
    body = client.get("/api/v1/telemetry/actions/").json()
    assert [row["id"] for row in body["results"]] == [action.pk]
    assert body["results"][0]["action"] == "pause" and "starts at" in body["results"][0]["reason"]

    client.force_login(factories.member(tenant=theirs))
    assert client.get("/api/v1/telemetry/actions/").json()["results"] == []
    assert EnforcementAction.objects.count() == 1
