"""Node and GPU failures end to end (issue 37 item 4): real simulated agents report to the app
under gunicorn; one is killed mid-window, another's GPU reports an XID error from the faults
file. The health pass refunds the work that could not run and re-places it on the healthy
node, the team is told, the fleet page says why the GPU failed, and the ledger stays clean."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation
from telemetry.models import Gpu, Node
from telemetry.services import node_register, nodes_health_check
from tenants.ledger import MILLI, ledger_verify
from tenants.models import Notification, Transfer
from tests import factories
from tests.telemetry.live import AgentProcess, wait_until
from tests.telemetry.market_data import settled_gang

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

STALE_SECONDS = 10


@pytest.fixture
def agents(server, tmp_path, tier, monkeypatch, settings):
    """Two simulated nodes of four GPUs on ``tier``, their agents running; GPU faults are
    read from ``tmp_path / "faults.json"``."""
    settings.GPUMARKET_NODE_STALE_SECONDS = STALE_SECONDS
    monkeypatch.setenv("GPUMARKET_SIM_FAULTS", str(tmp_path / "faults.json"))
    running = {}
    for name in ("fail-a", "fail-b"):
        node, token = node_register(name=name, tier=tier, actor="test")
        running[name] = AgentProcess(
            server=server.url,
            token=token,
            node_name=name,
            log_path=tmp_path / f"{name}.log",
            interval=0.5,
            gpus=4,
        )
        running[name].start()
    try:
        assert wait_until(
            lambda: (
                Gpu.objects.filter(tier=tier).count() == 8
                and Node.objects.filter(healthy=True).count() == 2
            ),
            timeout=30,
        ), "\n".join(a.log() for a in running.values())
        yield running
    finally:
        for agent in running.values():
            agent.stop()


def _refunds(allocation: Allocation) -> list[int]:
    return list(
        Transfer.objects.filter(reference=f"allocation:{allocation.pk}", kind="refund")
        .order_by("pk")
        .values_list("amount", flat=True)
    )


def test_a_node_killed_mid_window_refunds_the_lost_time_and_replaces_the_work(agents, tier):
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    allocation = settled_gang(tier=tier, tenant=team, user=factories.member(tenant=team))
    (node,) = {g["node"] for g in allocation.placement}
    other = next(name for name in agents if name != node)

    agents[node].stop()  # the node dies
    killed_at = timezone.now()
    assert wait_until(
        lambda: (
            timezone.now() - Node.objects.get(name=node).last_seen_at
            > timedelta(seconds=STALE_SECONDS)
        ),
        timeout=40,
    )
    later = timezone.now()
    nodes_health_check(now=later)

    assert not Node.objects.get(name=node).healthy
    assert Node.objects.get(name=other).healthy and agents[other].alive
    allocation.refresh_from_db()
    assert allocation.status == Allocation.Status.ACTIVE
    assert {g["node"] for g in allocation.placement} == {other}
    (refund,) = _refunds(allocation)
    # From the node's last batch (before it was killed) to the move, of the window's charge.
    last_seen = Node.objects.get(name=node).last_seen_at
    assert last_seen <= killed_at
    window = allocation.ends_at - allocation.starts_at
    assert refund == allocation.charge * (later - last_seen) // window > 0
    assert Notification.objects.filter(tenant=team, kind="work_moved").exists()
    assert AuditEvent.objects.filter(action="allocation.gpu_failure").count() == 1
    nodes_health_check()  # the next pass changes nothing
    assert _refunds(allocation) == [refund]
    assert ledger_verify() == []


def test_an_xid_error_reported_by_the_agent_puts_the_gpu_in_maintenance_with_its_reason(
    agents, tier, tmp_path, client
):
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    allocation = settled_gang(tier=tier, tenant=team, user=factories.member(tenant=team))
    first = allocation.placement[0]
    (tmp_path / "faults.json").write_text(json.dumps({str(first["index"]): "xid"}))

    assert wait_until(lambda: Gpu.objects.get(uuid=first["uuid"]).maintenance, timeout=20), agents[
        first["node"]
    ].log()
    gpu = Gpu.objects.get(uuid=first["uuid"])
    assert gpu.failure.startswith("XID 48") and gpu.failed_at is not None
    allocation.refresh_from_db()
    assert first["uuid"] not in {g["uuid"] for g in allocation.placement}
    assert len(allocation.placement) == 2 and allocation.status == Allocation.Status.ACTIVE
    assert Notification.objects.filter(tenant=team, kind="work_moved").exists()
    client.force_login(factories.admin_user())
    page = client.get(reverse("fleet")).content.decode()
    assert f"failed: {gpu.failure}" in page
    assert ledger_verify() == []
