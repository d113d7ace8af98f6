"""A standing order's work on a real single-node Slurm (scripts/slurm.sh), end to end: a real
`sbatch` job of the order (its allocation in the job's comment), a real agent with the Slurm
executor, and a real Celery worker running the enforcement loop.

The order's window ends and it won no other: the job gets its checkpoint signal (its script
traps USR1 and notes it), is requeued and held after the grace, with its GPUs free. The order
wins the next window, placed on the same GPU and reserved in Slurm: the held job, which no
sample shows, is released into the new window's reservation and runs again; it is never
cancelled. No stand-in: if Slurm is not running this test fails and says how to start it.
"""

from __future__ import annotations

import secrets
import sys
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from market.models import Allocation, Bid, Order
from market.placement.launch import launch_token
from market.services.slurm_reservations import (
    reservation_name,
    slurm_account,
    slurm_reservations_create,
)
from telemetry.models import EnforcementAction
from telemetry.services import node_register
from tenants.ledger import MILLI
from tests import factories
from tests.conftest import CeleryWorker
from tests.conftest import test_database_url as database_url  # aliased: pytest would collect test_*
from tests.telemetry.live import AgentProcess, BeatTicks, LiveServer, wait_until
from tests.telemetry.market_data import allocation_make
from tests.telemetry.test_slurm_real import (  # noqa: F401 (slurm_cleanup, slurm_node: fixtures)
    _association,
    _job,
    _job_pids,
    _lines,
    _run,
    _submit,
    slurm_cleanup,
    slurm_node,
)

pytestmark = [
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slurm_cleanup"),
]

AGENT_SECONDS = 1.0
ENFORCE_SECONDS = 1.5
WITHIN = 3 * ENFORCE_SECONDS + 2 * AGENT_SECONDS + 3  # plus the Slurm round trips
GRACE_SECONDS = 3
KILL_WAIT = 2  # the test cluster's KillWait (scripts/slurm.sh)


def _window(team, tier, order, node: str, *, starts_at, ends_at) -> Allocation:
    """An allocation of ``order`` placed on GPU 0 of ``node`` (the simulated agent's uuids)."""
    allocation = allocation_make(
        tenant=team, tier=tier, gpus=1, starts_at=starts_at, ends_at=ends_at
    )
    Bid.objects.filter(pk=allocation.bid_id).update(order=order)
    allocation.placement = [{"node": node, "index": 0, "uuid": f"GPU-SIM-{node}-0"}]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save(update_fields=["placement", "launch_secret"])
    return allocation


def _checkpointing(directory) -> str:
    """A batch job of one process (as a training job's, which the agent sees on its GPU) that
    notes each start, and each SIGUSR1 (its checkpoint), in files in ``directory``."""
    code = (
        "import signal, time\n"
        f"open('{directory}/starts', 'a').write('start\\n')\n"
        "signal.signal(signal.SIGUSR1, lambda *_: "
        f"open('{directory}/checkpoints', 'a').write('checkpoint\\n'))\n"
        "while True:\n"
        "    time.sleep(0.2)\n"
    )
    return f'#!/bin/sh\nexec {sys.executable} -c "{code}"\n'


def _token(allocation: Allocation, node: str) -> str:
    """What `gpumarket run --allocation` puts in the job's environment."""
    return launch_token(
        secret=allocation.launch_secret,
        allocation_id=allocation.pk,
        node=node,
        uuids=[g["uuid"] for g in allocation.placement],
    )


def test_an_orders_slurm_job_is_requeued_held_on_a_loss_and_released_on_a_win(
    request, redis_url, tmp_path, tier, monkeypatch
):
    host = request.getfixturevalue("slurm_node")  # fails when Slurm is not up
    redis.Redis.from_url(redis_url).flushdb()
    # The web app sends a released job's reservation only when settlement makes them.
    monkeypatch.setenv("GPUMARKET_SLURM_RESERVATIONS", "1")
    worker = CeleryWorker(
        database_url=database_url(),
        broker_url=redis_url,
        log_path=tmp_path / "worker.log",
        extra_env={"GPUMARKET_PREEMPT_GRACE_SECONDS": str(GRACE_SECONDS)},
    )
    server = LiveServer(
        database_url=database_url(), broker_url=redis_url, log_path=tmp_path / "web.log"
    )
    now = timezone.now()
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    order = Order.objects.create(
        tenant=team,
        author=factories.member(tenant=team),
        name="three-day run",
        gpus=1,
        min_gpus=1,
        ceiling=100 * MILLI,
    )
    first = _window(
        team,
        tier,
        order,
        host,
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=1),
    )
    account = slurm_account(team.slug)
    _run("sacctmgr", "-i", "add", "account", account, f"Description={account}")
    _association(account)
    node, token = node_register(name=host, tier=tier, actor="test")
    worker.start()
    server.start()
    agent = AgentProcess(
        server=server.url,
        token=token,
        node_name=node.name,
        log_path=tmp_path / "agent.log",
        interval=AGENT_SECONDS,
        executor="slurm",
    )
    agent.start()
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    beat.start()
    try:
        job = _submit(
            f"--comment=gpumarket:allocation={first.pk}",
            f"--account={account}",
            "--export=ALL",
            script=_checkpointing(tmp_path),
            env={
                "GPUMARKET_SIM_NODE": node.name,
                "GPUMARKET_SIM_GPU": "0",
                "GPUMARKET_LAUNCH_TOKEN": _token(first, node.name),
            },
        )
        assert wait_until(lambda: _lines(tmp_path / "starts") == ["start"], timeout=30), _job(job)
        # Its window runs: the loop leaves it alone.
        assert not wait_until(
            lambda: EnforcementAction.objects.filter(node=node).exists(), timeout=WITHIN
        ), list(EnforcementAction.objects.values_list("action", "reason"))

        # 1. The window ends and the order won nothing: checkpoint signal, then requeued and
        # held after the grace.
        Allocation.objects.filter(pk=first.pk).update(ends_at=timezone.now() + timedelta(seconds=2))
        assert wait_until(
            lambda: _lines(tmp_path / "checkpoints") == ["checkpoint"], timeout=WITHIN + 2
        ), (_job(job), agent.log())
        assert wait_until(
            lambda: _job(job).get("Reason") == "job_requeued_in_held_state",
            timeout=WITHIN + GRACE_SECONDS + KILL_WAIT,
        ), (_job(job), agent.log())
        suspend = EnforcementAction.objects.get(action="suspend", slurm_job=job)
        assert f"order {order.pk} did not win this window" in suspend.reason
        assert wait_until(
            lambda: EnforcementAction.objects.get(pk=suspend.pk).state == "acknowledged",
            timeout=WITHIN,
        ), agent.log()
        held = _job(job)
        assert (held["JobState"], held["Restarts"]) == ("PENDING", "1")
        assert _job_pids(job) == []
        # Out of the round, it stays held.
        assert not wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=WITHIN)

        # 2. The order wins the next window, on the same GPU, and settlement reserved it.
        won = timezone.now()
        second = _window(
            team,
            tier,
            order,
            host,
            starts_at=won - timedelta(seconds=1),
            ends_at=won + timedelta(minutes=5),
        )
        (reserved,) = slurm_reservations_create(allocation_ids=[second.pk])
        assert reserved.name == reservation_name(second)
        assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=WITHIN + 10), (
            _job(job),
            agent.log(),
        )
        resume = EnforcementAction.objects.get(action="resume", slurm_job=job)
        assert resume.allocation_id == second.pk and resume.pid == suspend.pid
        assert _job(job)["Reservation"] == reservation_name(second)
        assert wait_until(lambda: _lines(tmp_path / "starts") == ["start", "start"], timeout=10)
        assert wait_until(
            lambda: EnforcementAction.objects.get(pk=resume.pk).state == "acknowledged",
            timeout=WITHIN,
        ), agent.log()
        resume.refresh_from_db()
        assert resume.detail == (
            f"scontrol release {job} (requeued; StartTime=now) into reservation "
            f"{reservation_name(second)}"
        )
        # Running in the order's new window, its work is left alone: never cancelled.
        assert not wait_until(lambda: _job(job).get("JobState") != "RUNNING", timeout=WITHIN)
        assert list(
            EnforcementAction.objects.filter(slurm_job=job)
            .order_by("pk")
            .values_list("action", flat=True)
        ) == ["suspend", "resume"]
        assert _lines(tmp_path / "checkpoints") == ["checkpoint"]
    finally:
        beat.stop()
        agent.stop()
        server.stop()
        worker.stop()
