"""The market driven through a REAL Celery worker on PostgreSQL and Redis.

Beat is not running here: every message the worker handles is one this test sent, so what
settles a round after a crash can only be the redelivered message.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.db.models import Count, Sum
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation, Bid, Round
from market.services.bids import bid_place
from market.services.round_clearing import CLEARING_HOLD_ENV
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Transfer
from tests import factories
from tests.conftest import CeleryWorker, free_port
from tests.conftest import test_database_url as worker_database_url
from tests.market.marketkit import market_make

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

WAIT_SECONDS = 90


@pytest.fixture
def broker(redis_url):
    """A client of the worker's broker, sending tasks by name as beat and the web do."""
    app = Celery(broker=redis_url)
    yield app
    app.close()


def _send(broker: Celery, name: str, *args):
    return broker.send_task(name, args=list(args), queue="clearing")


def _wait_for(what: str, check: Callable[[], bool], log: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"gave up waiting for {what}; worker log:\n{log.read_text()[-4000:]}")


def _due_round_with_bids():
    """A round whose bidding has closed and whose window is running now, with three bids from
    two teams. Opened half an hour before the current hour, it covers the current hour."""
    now = timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(minutes=30)
    market = market_make(now=start)
    teams = []
    for credits in (50_000, 50_000):
        tenant = factories.tenant(credits=credits)
        teams.append((tenant, factories.member(tenant=tenant)))
    (a, a_user), (b, b_user) = teams
    bid_place(
        user=a_user, tenant=a, round=market.round, quantity=3, limits={"a100": 3000}, now=start
    )
    bid_place(
        user=b_user,
        tenant=b,
        round=market.round,
        quantity=2,
        limits={"a100": 2000, "h100": 4000},
        now=start,
    )
    bid_place(
        user=b_user, tenant=b, round=market.round, quantity=1, limits={"h100": 2500}, now=start
    )
    assert market.round.closes_at <= timezone.now() < market.round.ends_at
    return market, [a, b]


def _settled(round_id: int) -> bool:
    return Round.objects.filter(pk=round_id, status__in=["settled", "finished"]).exists()


def _assert_settled_once(round_id: int, tenants) -> None:
    rnd = Round.objects.get(pk=round_id)
    assert rnd.status == "settled"
    assert AuditEvent.objects.filter(action="round.settle", object_id=str(round_id)).count() == 1
    assert AuditEvent.objects.filter(action="round.clear", object_id=str(round_id)).count() == 1
    bids = Bid.objects.filter(round=rnd)
    references = [f"bid:{b.pk}" for b in bids]
    per_bid = (
        Transfer.objects.filter(reference__in=references, kind__in=["charge", "release"])
        .values("reference", "kind")
        .annotate(n=Count("id"))
    )
    assert all(row["n"] == 1 for row in per_bid)
    charged = (
        Transfer.objects.filter(reference__in=references, kind="charge").aggregate(s=Sum("amount"))[
            "s"
        ]
        or 0
    )
    allocations = Allocation.objects.filter(round=rnd)
    assert allocations.exists()
    assert charged == allocations.aggregate(s=Sum("charge"))["s"] == rnd.revenue
    assert set(bids.values_list("escrow", flat=True)) == {0}
    assert set(bids.values_list("status", flat=True)) <= {"won", "lost"}
    for tenant in tenants:
        assert balance_get(tenant=tenant).escrow == 0
    assert ledger_verify() == []


def test_a_due_round_is_cleared_and_settled_by_the_tick_sent_through_the_broker(
    celery_worker_process, broker
):
    market, tenants = _due_round_with_bids()
    _send(broker, "market.rounds_tick")
    _wait_for(
        "the tick to settle the round",
        lambda: _settled(market.round.pk),
        celery_worker_process.log_path,
    )
    _assert_settled_once(market.round.pk, tenants)
    # The same tick opened the next round for bidding.
    assert Round.objects.filter(status="open", closes_at__gt=timezone.now()).count() == 1


def test_a_worker_killed_mid_clearing_settles_the_round_exactly_once_after_redelivery(
    celery_worker_process, broker, tmp_path, monkeypatch
):
    worker = celery_worker_process
    market, tenants = _due_round_with_bids()
    hold = tmp_path / "hold"
    hold.mkdir()
    # Restart the worker with the fault-injection hook on: it will stop right after claiming
    # the round under its row lock, inside the clearing transaction.
    worker.stop()
    monkeypatch.setenv(CLEARING_HOLD_ENV, str(hold))
    worker.start()
    result = _send(broker, "market.round_clear", market.round.pk)
    marker = hold / f"claimed-{market.round.pk}"
    _wait_for("the worker to claim the round", marker.exists, worker.log_path)

    worker.stop(kill=True)  # SIGKILL, mid-clearing: the message is never acknowledged
    assert Round.objects.get(pk=market.round.pk).status == "open"  # the close rolled back too
    assert not Allocation.objects.exists()
    assert Transfer.objects.filter(kind="charge").count() == 0

    # Same worker command without the hook; Redis hands the unacknowledged message back once
    # it is older than the visibility timeout, which the restarted worker checks at start.
    monkeypatch.delenv(CLEARING_HOLD_ENV)
    monkeypatch.setenv("CELERY_BROKER_VISIBILITY_TIMEOUT", "1")
    time.sleep(1.5)
    worker.start()
    _wait_for(
        "the redelivered task to settle the round",
        lambda: _settled(market.round.pk),
        worker.log_path,
    )
    _assert_settled_once(market.round.pk, tenants)
    received = re.findall(
        rf"Task market\.round_clear\[{result.id}\] received", worker.log_path.read_text()
    )
    assert len(received) == 2  # delivered, killed, redelivered


def test_the_same_task_sent_twice_settles_once(celery_worker_process, broker):
    market, tenants = _due_round_with_bids()
    first = _send(broker, "market.round_clear", market.round.pk)
    second = _send(broker, "market.round_clear", market.round.pk)
    log = celery_worker_process.log_path

    def both_done() -> bool:
        text = log.read_text()
        return all(
            re.search(rf"Task market\.round_clear\[{r.id}\] succeeded", text)
            for r in (first, second)
        )

    _wait_for("both tasks to finish", both_done, log)
    _assert_settled_once(market.round.pk, tenants)


class RedisServer:
    """A Redis of this test's own, so that it can be killed and restarted (the machine's Redis
    is shared). It keeps an append-only file, as a production Redis that is restarted does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=open(self.folder / "redis.log", "ab"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
        )
        import redis

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping()
                return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("own redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _pings(url: str) -> Callable[[], bool]:
    def check() -> bool:
        import redis

        app = Celery(broker=url)
        try:
            return bool(app.control.ping(timeout=0.5))
        except (redis.RedisError, OSError):
            return False  # Redis is still loading its file
        finally:
            app.close()

    return check


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def test_a_redis_outage_mid_clearing_settles_the_round_once_without_a_restart(
    transactional_db, own_redis, tmp_path, monkeypatch
):
    market, tenants = _due_round_with_bids()
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(CLEARING_HOLD_ENV, str(hold))
    monkeypatch.setenv("CELERY_BROKER_VISIBILITY_TIMEOUT", "5")
    # Celery reads this variable before its broker argument: the clients below need it too.
    monkeypatch.setenv("CELERY_BROKER_URL", own_redis.url)
    worker = CeleryWorker(
        database_url=worker_database_url(),
        broker_url=own_redis.url,
        log_path=tmp_path / "worker.log",
        # As in production: a child process runs the task, the main one acknowledges it, and
        # gossip, mingle and heartbeats are on.
        pool="prefork",
        options=(),
    )
    try:
        worker.start()  # inside: a worker that never answers is stopped too
        app = Celery(broker=own_redis.url)
        app.send_task("market.round_clear", args=[market.round.pk], queue="clearing")
        app.close()
        _wait_for(
            "the worker to claim the round",
            (hold / f"claimed-{market.round.pk}").exists,
            worker.log_path,
        )

        own_redis.kill()  # the broker goes away while the task runs
        _wait_for(
            "the worker to notice",
            lambda: "Connection to broker lost" in worker.log_path.read_text(),
            worker.log_path,
        )
        (hold / f"release-{market.round.pk}").touch()
        _wait_for(
            "the task to settle the round", lambda: _settled(market.round.pk), worker.log_path
        )
        time.sleep(10)  # the task is done; its acknowledgement has nowhere to go
        assert worker.proc.poll() is None, worker.log_path.read_text()[-4000:]

        own_redis.start()
        # The worker reconnects by itself and answers over the broker again.
        _wait_for(
            "the worker to answer over the broker again", _pings(own_redis.url), worker.log_path
        )
        # A redelivered copy of the task (unacknowledged when Redis died) finds it done.
        time.sleep(8)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    _assert_settled_once(market.round.pk, tenants)
