"""End to end on PostgreSQL: the app under gunicorn, a real Celery worker fed enforcement ticks
through Redis, a real `gpumarket agent --backend simulated`, and real child processes that
get stopped (state T) and continued by the agent's signals on the platform's orders."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from telemetry.agent.simulated_backend import spawn_simulated_work
from telemetry.models import EnforcementAction, Gpu, IngestBatch, Sample
from telemetry.selectors import actions_for_tenant
from telemetry.services import node_register
from tenants.budgets import budget_set
from tenants.ledger import MILLI, credits_charge, credits_hold
from tests import factories
from tests.telemetry.live import AgentProcess, BeatTicks, process_state, wait_until
from tests.telemetry.market_data import allocation_make

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

AGENT_SECONDS = 1.0
ENFORCE_SECONDS = 1.5
# "Within three enforcement intervals": the agent reports a process within one agent
# interval, and picks up the directive with its next post.
WITHIN = 3 * ENFORCE_SECONDS + 2 * AGENT_SECONDS
# A server outage of a minute, as an operator would see during a restart or failover.
OUTAGE_SECONDS = 60


@pytest.fixture
def agent_factory(tmp_path):
    agents = []

    def start(**kwargs) -> AgentProcess:
        agent = AgentProcess(log_path=tmp_path / f"agent{len(agents)}.log", **kwargs)
        agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()


def stopped(pid: int) -> bool:
    return process_state(pid) == "T"


def running(pid: int) -> bool:
    return process_state(pid) not in ("T", None)


def actions(pid: int) -> list[tuple[str, str]]:
    return list(
        EnforcementAction.objects.filter(pid=pid).order_by("pk").values_list("action", "state")
    )


def test_enforcement_stops_and_continues_real_processes(
    celery_worker_process, redis_url, server, agent_factory, children, tier
):
    now = timezone.now()
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    granted = allocation_make(
        tenant=team,
        tier=tier,
        gpus=1,
        starts_at=now - timedelta(minutes=5),
        ends_at=now + timedelta(hours=1),
    )
    # A job submitted with the id of an allocation its tenant has not won (yet).
    awaited_id = granted.pk + 10_000
    node, token = node_register(name="e2e-node", tier=tier, actor="test")
    agent = agent_factory(
        server=server.url, token=token, node_name=node.name, interval=AGENT_SECONDS
    )
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    beat.start()
    try:
        allowed = spawn_simulated_work(node.name, 0, allocation=granted.pk, duty=0.2)
        waiting = spawn_simulated_work(node.name, 1, allocation=awaited_id, duty=0.2)
        children.extend([allowed, waiting])

        # 1. Work without an allocation is stopped; allocated work runs on.
        assert wait_until(lambda: Gpu.objects.filter(node=node).count() == 2, timeout=20), (
            agent.log()
        )
        assert wait_until(lambda: stopped(waiting.pid), timeout=WITHIN), (
            actions(waiting.pid),
            agent.log(),
        )
        assert running(allowed.pid)
        assert wait_until(lambda: actions(waiting.pid) == [("pause", "acknowledged")], timeout=10)
        pause = EnforcementAction.objects.get(pid=waiting.pid)
        assert f"allocation {awaited_id} does not exist" in pause.reason

        # 2. The tenant wins that allocation: the job runs again.
        allocation_make(
            tenant=team,
            tier=tier,
            gpus=1,
            starts_at=now - timedelta(minutes=1),
            ends_at=now + timedelta(hours=1),
            pk=awaited_id,
        )
        assert wait_until(lambda: running(waiting.pid), timeout=WITHIN), (
            actions(waiting.pid),
            agent.log(),
        )
        assert wait_until(
            lambda: actions(waiting.pid) == [("pause", "acknowledged"), ("resume", "acknowledged")],
            timeout=10,
        )
        assert actions(allowed.pid) == []

        # 3. A hard cap is reached: all of the tenant's work pauses.
        budget_set(tenant=team, window="day", mode="hard", cap=100 * MILLI, actor=None)
        credits_hold(tenant=team, amount=100 * MILLI, actor=None, reason="usage", reference="e2e")
        credits_charge(tenant=team, amount=100 * MILLI, actor=None, reason="usage", reference="e2e")
        assert wait_until(lambda: stopped(allowed.pid) and stopped(waiting.pid), timeout=WITHIN), (
            agent.log()
        )

        # 4. The cap is raised: it resumes.
        budget_set(tenant=team, window="day", mode="hard", cap=500 * MILLI, actor=None)
        assert wait_until(lambda: running(allowed.pid) and running(waiting.pid), timeout=WITHIN), (
            agent.log()
        )
        assert wait_until(
            lambda: (
                all(
                    state == "acknowledged"
                    for _, state in actions(allowed.pid) + actions(waiting.pid)
                )
                and len(actions(allowed.pid)) == 2
            ),
            timeout=10,
        )
    finally:
        beat.stop()

    assert actions(allowed.pid) == [("pause", "acknowledged"), ("resume", "acknowledged")]
    assert actions(waiting.pid) == [("pause", "acknowledged"), ("resume", "acknowledged")] * 2
    hard_cap = EnforcementAction.objects.filter(pid=allowed.pid, action="pause").get()
    assert "hard cap" in hard_cap.reason and hard_cap.tenant_id == team.pk
    # Every step audited (issued and acknowledged) and visible to the tenant.
    # The first pause has no tenant: the allocation it named did not exist yet.
    assert EnforcementAction.objects.filter(tenant=team).count() == 5
    assert (
        AuditEvent.objects.filter(action__in=["enforcement.pause", "enforcement.resume"]).count()
        == 6
    )
    assert AuditEvent.objects.filter(action="enforcement.acknowledged").count() == 6
    assert actions_for_tenant(tenant=team).count() == 5
    assert agent.alive


def _gaps(times: list) -> float:
    return max((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))


def test_agent_survives_an_outage_and_delivers_its_backlog(server, agent_factory, tier):
    node, token = node_register(name="outage-node", tier=tier, actor="test")
    agent = agent_factory(
        server=server.url, token=token, node_name=node.name, interval=AGENT_SECONDS
    )
    assert wait_until(lambda: IngestBatch.objects.filter(node=node).count() >= 3, timeout=20), (
        agent.log()
    )

    server.stop()
    down_at = timezone.now()
    time.sleep(OUTAGE_SECONDS)
    up_at = timezone.now()
    assert agent.alive
    server.start()

    def outage_delivered() -> bool:
        return Sample.objects.filter(gpu__node=node, at__gt=up_at + timedelta(seconds=2)).exists()

    assert wait_until(outage_delivered, timeout=120), agent.log()
    assert agent.alive
    log = agent.log()
    assert "server unavailable" in log  # it did see the outage
    assert "dropped the oldest" not in log and "server refused batch" not in log
    for gpu in Gpu.objects.filter(node=node):
        times = list(Sample.objects.filter(gpu=gpu).order_by("at").values_list("at", flat=True))
        during = [t for t in times if down_at <= t <= up_at]
        # One sample per agent interval while the server was down, delivered afterwards.
        assert len(during) >= OUTAGE_SECONDS / AGENT_SECONDS - 2, (gpu.uuid, len(during))
        # No batch missing anywhere: no hole of several intervals in the sample stream.
        assert _gaps(times) < 3 * AGENT_SECONDS, (gpu.uuid, _gaps(times))


def test_a_hostile_process_cannot_blind_its_node_and_is_paused(
    celery_worker_process, redis_url, server, agent_factory, children, tier
):
    """A job that sets a 100-character SLURM_JOB_ID, a 300-character POD_NAME and a claim
    that is no allocation id once made every batch of its node fail: the job was never paused
    and the node's GPUs left capacity. Now its node keeps reporting and the job is paused."""
    now = timezone.now()
    team = factories.tenant(name="Owners", credits=1_000 * MILLI)
    granted = allocation_make(
        tenant=team,
        tier=tier,
        gpus=1,
        starts_at=now - timedelta(minutes=5),
        ends_at=now + timedelta(hours=1),
    )
    node, token = node_register(name="hostile-node", tier=tier, actor="test")
    agent = agent_factory(
        server=server.url, token=token, node_name=node.name, interval=AGENT_SECONDS
    )
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    beat.start()
    try:
        owner = spawn_simulated_work(node.name, 0, allocation=granted.pk, duty=0.2)
        hostile = spawn_simulated_work(
            node.name,
            1,
            duty=0.2,
            extra_env={
                "SLURM_JOB_ID": "9" * 100,
                "POD_NAME": "p" * 300,
                "GPUMARKET_ALLOCATION": f"{granted.pk}; DROP TABLE",
            },
        )
        children.extend([owner, hostile])
        assert wait_until(lambda: Gpu.objects.filter(node=node).count() == 2, timeout=20), (
            agent.log()
        )
        assert wait_until(lambda: stopped(hostile.pid), timeout=WITHIN), (
            actions(hostile.pid),
            agent.log(),
        )
        assert running(owner.pid)
        # The node keeps reporting: batches keep arriving and none was refused.
        before = IngestBatch.objects.filter(node=node).count()
        assert wait_until(
            lambda: IngestBatch.objects.filter(node=node).count() >= before + 2, timeout=10
        ), agent.log()
    finally:
        beat.stop()
    node.refresh_from_db()
    assert node.healthy and node.refused_batches == 0
    assert Gpu.objects.filter(node=node, healthy=True).count() == 2
    pause = EnforcementAction.objects.get(pid=hostile.pid, action="pause")
    assert pause.allocation_ref is None
    assert agent.alive
