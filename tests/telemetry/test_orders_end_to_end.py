"""Standing orders end to end: a real Celery worker clears and settles the rounds and runs
the enforcement loop, a real simulated agent carries out its directives on a real process,
and the order's work lives across rounds as a researcher's run would.

The order wins three windows in a row and its process is never signalled; it loses the
fourth (another team outbids it) and its process gets the checkpoint signal and is stopped,
never killed; it wins the fifth and the same process resumes on the same GPUs; it then has
the GPU-hours it asked for, stops bidding, and its work ends with the window. A second order
runs out of its ceiling and stops with the reason. The windows are 15 s long: the rounds are
made by the test (one open at a time, as the market keeps them) and cleared by the worker.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from django.utils import timezone

from market.models import Allocation, Bid, Order, Round
from market.services.bids import bid_place
from market.services.launch import allocation_launch
from market.services.orders.lifecycle import order_create
from market.services.orders.opening import orders_bid
from market.services.policy import policy_activate, policy_active, policy_version_create
from telemetry.agent.simulated_backend import spawn_simulated_work
from telemetry.models import EnforcementAction, Gpu, Node
from telemetry.services import node_register
from tenants.ledger import MILLI
from tests import factories
from tests.conftest import CeleryWorker
from tests.conftest import test_database_url as database_url  # aliased: pytest would collect test_*
from tests.telemetry.live import AgentProcess, BeatTicks, process_state, wait_until

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

WINDOW = timedelta(seconds=15)
AGENT_SECONDS = 1.0
ENFORCE_SECONDS = 1.5
GRACE_SECONDS = 2


def _policy(tier) -> None:
    """Welfare, one-minute rounds (what an order's first window is checked against), and a
    reserve of 3.000 credits per GPU-hour on the tier."""
    version = policy_version_create(
        actor=None, mechanism="welfare", round_minutes=1, reserve_prices={tier.slug: 3000}
    )
    policy_activate(version=version, actor=None)


def _signals(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


class Rounds:
    """Rounds of WINDOW seconds, opened by the test and cleared by the worker's task."""

    def __init__(self, app: Celery, first_start):
        self.app = app
        self.starts_at = first_start
        self.policy = policy_active()

    def open(self) -> Round:
        rnd = Round.objects.create(
            policy=self.policy,
            status=Round.Status.OPEN,
            opens_at=timezone.now(),
            closes_at=self.starts_at,
            starts_at=self.starts_at,
            ends_at=self.starts_at + WINDOW,
        )
        orders_bid(round_id=rnd.pk)
        self.starts_at += WINDOW
        return rnd

    def clear(self, rnd: Round) -> None:
        """At its close, the worker clears and settles it (the task the tick sends)."""
        wait_until(lambda: timezone.now() >= rnd.closes_at, timeout=60, step=0.05)
        self.app.send_task("market.round_clear", args=[rnd.pk], queue="clearing")
        assert wait_until(
            lambda: Round.objects.get(pk=rnd.pk).status == Round.Status.SETTLED, timeout=30
        ), Round.objects.get(pk=rnd.pk).failure_reason


def test_an_orders_work_runs_across_wins_is_suspended_on_a_loss_and_resumes(
    redis_url, server, tmp_path, children, tier
):
    redis.Redis.from_url(redis_url).flushdb()
    worker = CeleryWorker(
        database_url=database_url(),
        broker_url=redis_url,
        log_path=tmp_path / "worker.log",
        extra_env={"GPUMARKET_PREEMPT_GRACE_SECONDS": str(GRACE_SECONDS)},
    )
    node, node_token = node_register(name="orders-node", tier=tier, actor="test")
    agent = AgentProcess(
        server=server.url,
        token=node_token,
        node_name=node.name,
        log_path=tmp_path / "agent.log",
        interval=AGENT_SECONDS,
        gpus=4,
    )
    app = Celery(broker=redis_url)
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    worker.start()
    agent.start()
    beat.start()
    try:
        assert wait_until(
            lambda: (
                Gpu.objects.filter(node=node).count() == 4 and Node.objects.get(pk=node.pk).healthy
            ),
            timeout=30,
        ), agent.log()
        _policy(tier)
        team = factories.tenant(name="Vision", credits=1_000 * MILLI)
        user = factories.member(tenant=team)
        # The rival's entitlement is twenty times the team's, so the fairness guarantee does
        # not keep the team's order on the GPUs when the rival outbids it.
        rival = factories.tenant(name="Speech", credits=1_000 * MILLI, weight=20)
        rival_user = factories.member(tenant=rival)
        rounds = Rounds(app, timezone.now() + timedelta(seconds=8))
        first = rounds.open()
        gpu_seconds = 2 * int(WINDOW.total_seconds())
        order = order_create(
            user=user,
            tenant=team,
            name="long run",
            values={tier.slug: 10_000},
            gpus=2,
            gpu_seconds_wanted=4 * gpu_seconds,  # four windows' worth
            ceiling=100 * MILLI,
            restart_seconds=10,
        )
        thrifty = order_create(
            user=user,
            tenant=team,
            name="thrifty",
            values={tier.slug: 3600},
            gpus=1,
            # Milli-credits: a minute at its value; it pays the reserve, 12 a window, and
            # near the ceiling bids lower until even the reserve no longer fits (window 6).
            ceiling=60,
        )
        assert Bid.objects.filter(round=first, order=order).exists()

        # Window 1: won. The researcher's job starts on the placed GPUs.
        rounds.clear(first)
        allocation = Allocation.objects.get(bid__order=order, round=first)
        placed = {g["uuid"] for g in allocation.placement}
        assert len(placed) == 2
        log = tmp_path / "signals.log"
        launch = allocation_launch(allocation=allocation, node=node.name)
        work = spawn_simulated_work(
            node.name,
            None,
            duty=0.2,
            extra_env={**launch.env, "GPUMARKET_SIM_SIGNAL_LOG": str(log)},
        )
        children.append(work)

        # Windows 2 and 3: won again, on the same GPUs; the process is never signalled.
        for _ in range(2):
            rnd = rounds.open()
            rounds.clear(rnd)
            renewed = Allocation.objects.get(bid__order=order, round=rnd)
            assert {g["uuid"] for g in renewed.placement} == placed
        # Window 4 is outbid: another team bids far more for every GPU.
        lost = rounds.open()
        bid_place(
            user=rival_user, tenant=rival, round=lost, quantity=4, limits={tier.slug: 200_000}
        )
        # Until window 3 ends the work has run untouched for three windows.
        wait_until(lambda: timezone.now() >= lost.starts_at - timedelta(seconds=1), timeout=60)
        assert _signals(log) == []
        assert not EnforcementAction.objects.filter(pid=work.pid).exists()
        assert process_state(work.pid) not in ("T", None)

        rounds.clear(lost)
        # The checkpoint signal, the grace, then stopped: suspended, not killed.
        assert wait_until(lambda: process_state(work.pid) == "T", timeout=20), agent.log()
        assert _signals(log) == ["SIGUSR1"]
        suspend = EnforcementAction.objects.get(pid=work.pid)
        assert suspend.action == "suspend" and "did not win this window" in suspend.reason
        order.refresh_from_db()
        assert (order.rounds_won, order.rounds_lost, order.preemptions) == (3, 1, 1)

        # Window 5: won again; the same process resumes on the same GPUs.
        again = rounds.open()
        rounds.clear(again)
        back = Allocation.objects.get(bid__order=order, round=again)
        assert {g["uuid"] for g in back.placement} == placed
        assert wait_until(lambda: process_state(work.pid) not in ("T", None), timeout=20)
        assert wait_until(lambda: _signals(log) == ["SIGUSR1", "SIGCONT"], timeout=5), _signals(log)
        order.refresh_from_db()
        # Four windows of two GPUs: what it asked for. It is done and bids no more ...
        assert order.status == Order.Status.DONE, order.hold_reason
        assert order.gpu_seconds == 4 * gpu_seconds
        last = rounds.open()
        assert not Bid.objects.filter(round=last, order=order).exists()
        # ... and its work ends with the window: SIGTERM after the window, as any ended work.
        assert wait_until(lambda: work.poll() is not None, timeout=40), agent.log()
        assert _signals(log)[-1] == "SIGTERM"

        thrifty.refresh_from_db()
        assert thrifty.status == Order.Status.EXHAUSTED, thrifty.hold_reason
        assert "spend ceiling leaves" in thrifty.status_reason
        assert thrifty.spent <= thrifty.ceiling
    finally:
        beat.stop()
        agent.stop()
        worker.stop()
        app.close()


def test_a_thousand_orders_become_bids_at_one_rounds_open_on_the_worker(
    celery_worker_process, redis_url, tier
):
    _policy(tier)
    teams = [factories.tenant(name=f"Team {i}", credits=100 * MILLI) for i in range(20)]
    users = [factories.member(tenant=t) for t in teams]
    for i in range(1000):
        order_create(
            user=users[i % 20],
            tenant=teams[i % 20],
            name=f"job {i}",
            values={tier.slug: 3000 + i},
            gpus=1,
            ceiling=50 * MILLI,
        )
    assert not Bid.objects.exists()
    app = Celery(broker=redis_url)
    try:
        app.send_task("market.rounds_tick", queue="clearing")
        assert wait_until(
            lambda: Bid.objects.filter(order__isnull=False, status="open").count() == 1000,
            timeout=60,
        )
    finally:
        app.close()
    rnd = Round.objects.get(status=Round.Status.OPEN)
    assert Bid.objects.filter(round=rnd, order__isnull=False).count() == 1000
