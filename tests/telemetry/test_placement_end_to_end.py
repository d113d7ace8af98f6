"""Placement end to end (issue 11): a round settles on GPUs a real simulated agent reported,
`gpumarket run --allocation N` starts a real process on exactly the placed GPUs (the agent
reports it there), and work started on another GPU, or without the launch token, is paused
by the real enforcement loop (a Celery worker fed ticks through Redis) within three
intervals while the launched work runs on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from market.services.launch import allocation_launch
from telemetry.agent.simulated_backend import spawn_simulated_work
from telemetry.models import EnforcementAction, Gpu, Node, ProcessObservation
from telemetry.services import node_register
from tenants.ledger import MILLI
from tenants.services.tokens import token_create
from tests import factories
from tests.conftest import ROOT
from tests.telemetry.live import AgentProcess, BeatTicks, process_state, wait_until
from tests.telemetry.market_data import settled_gang

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

AGENT_SECONDS = 1.0
ENFORCE_SECONDS = 1.5
WITHIN = 3 * ENFORCE_SECONDS + 2 * AGENT_SECONDS
BUSY = "import time\nwhile True:\n    sum(range(20000))\n    time.sleep(0.05)\n"


def test_gpumarket_run_lands_on_the_placed_gpus_and_strays_are_paused(
    celery_worker_process, redis_url, server, tmp_path, children, tier
):
    node, node_token = node_register(name="e2e-node", tier=tier, actor="test")
    agent = AgentProcess(
        server=server.url,
        token=node_token,
        node_name=node.name,
        log_path=tmp_path / "agent.log",
        interval=AGENT_SECONDS,
        gpus=4,
    )
    agent.start()
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    beat.start()
    try:
        # The agent reports four GPUs in two NVLink islands; the tier's capacity follows.
        assert wait_until(
            lambda: (
                Gpu.objects.filter(node=node).exclude(nvlink_domain="").count() == 4
                and Node.objects.get(pk=node.pk).healthy
            ),
            timeout=30,
        ), agent.log()
        tier.refresh_from_db()
        assert tier.capacity == 4

        team = factories.tenant(name="Vision", credits=1_000 * MILLI)
        user = factories.member(tenant=team)
        allocation = settled_gang(tier=tier, tenant=team, user=user)
        placed = {g["uuid"] for g in allocation.placement}
        domains = set(Gpu.objects.filter(uuid__in=placed).values_list("nvlink_domain", flat=True))
        assert len(placed) == 2 and len(domains) == 1  # a gang of two inside one island

        # The researcher starts the job the way the allocation page says.
        launched = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumarket",
                "run",
                "--allocation",
                str(allocation.pk),
                "--url",
                server.url,
                "--",
                sys.executable,
                "-c",
                BUSY,
            ],  # fmt: skip
            cwd=ROOT,
            env={
                **os.environ,
                "GPUMARKET_TOKEN": token_create(user=user, name="laptop").secret,
                "GPUMARKET_SIM_NODE": node.name,  # how the simulated node sees its processes
            },
            start_new_session=True,
        )
        children.append(launched)

        def seen_on(pid: int) -> set[str]:
            return set(
                ProcessObservation.objects.filter(pid=pid).values_list("gpu__uuid", flat=True)
            )

        # `gpumarket run` replaced itself with the command: that pid is on exactly its GPUs.
        assert wait_until(lambda: seen_on(launched.pid) == placed, timeout=20), (
            seen_on(launched.pid),
            agent.log(),
        )

        # Someone copies the tag and the token but runs on another GPU; someone else copies
        # only the tag, on the allocation's own GPU.
        launch = allocation_launch(allocation=allocation, node=node.name)
        other_gpu = next(g.index for g in Gpu.objects.filter(node=node) if g.uuid not in placed)
        stray = spawn_simulated_work(node.name, other_gpu, duty=0.2, extra_env=launch.env)
        thief = spawn_simulated_work(
            node.name, launch.indices[0], allocation=allocation.pk, duty=0.2
        )
        children.extend([stray, thief])
        assert wait_until(
            lambda: process_state(stray.pid) == "T" and process_state(thief.pid) == "T",
            timeout=WITHIN + 2 * AGENT_SECONDS,
        ), agent.log()
        reasons = dict(
            EnforcementAction.objects.filter(
                pid__in=[stray.pid, thief.pid], action="pause"
            ).values_list("pid", "reason")
        )
        assert "is not one of them" in reasons[stray.pid]
        assert "carries no launch token" in reasons[thief.pid]
        # The launched job was never touched.
        assert process_state(launched.pid) not in ("T", None)
        assert not EnforcementAction.objects.filter(pid=launched.pid).exists()
    finally:
        beat.stop()
        agent.stop()
