"""The README's first command: ``gpumarket demo`` brings the whole embedded platform up.

Runs the real command (SQLite, the file broker, worker with beat, two simulated agents) in a
temporary folder and reads what a visitor would see: the login page, both simulated nodes
reporting, the enforcement loop pausing the process that has no allocation, and the demo
teams' standing orders bidding in the rounds with nothing else placing bids. Its seed is
also run on its own against the test database: the orders are made once and win rounds.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from gpumarket import demo
from gpumarket.demo import NODES as DEMO_NODES
from market.demo import DEMO_ORDERS
from market.models import Bid, Order, Round, Tier
from market.services.tick import rounds_tick
from market.services.tiers import tier_capacity_set
from tests.conftest import ROOT, free_port


def _metric(body: str, name: str, labels: str) -> float:
    match = re.search(rf"^{name}{{{re.escape(labels)}}} (\S+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_demo_serves_the_site_and_its_simulated_nodes_report_and_get_enforced(tmp_path):
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        # The demo as on a fresh machine: none of the test run's settings or secrets.
        if k
        not in {
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "DJANGO_SETTINGS_MODULE",
            "SECRET_KEY",
            "GPUMARKET_AUDIT_KEYS",
            "GPUMARKET_AUDIT_CHECKPOINT_PATH",
            "GPUMARKET_METRICS_TOKEN",
        }
    }
    env.update(GPUMARKET_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "demo.log", "wb")  # noqa: SIM115 - closed below
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpumarket", "demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        login = None
        while time.monotonic() < deadline and login is None:
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()
            try:
                login = requests.get(f"{base}/login/", timeout=10)
            except (requests.ConnectionError, requests.Timeout):
                # Not listening yet, or still busy with its first request (the site, a worker
                # and two agents start together on two cores): ask again.
                time.sleep(0.5)
        assert login is not None and login.status_code == 200
        assert "Log in" in login.text

        healthy = paused = 0.0
        while time.monotonic() < deadline and not (healthy == len(DEMO_NODES) and paused >= 1):
            body = requests.get(f"{base}/metrics", timeout=30).text
            healthy = _metric(body, "gpumarket_nodes", 'state="healthy"')
            paused = _metric(
                body, "gpumarket_enforcement_actions", 'action="pause",state="acknowledged"'
            )
            time.sleep(1)
        log.flush()
        output = (tmp_path / "demo.log").read_text()
        assert healthy == len(DEMO_NODES), output
        assert (
            _metric(body, "gpumarket_nodes_simulated", "") == 0
            or "gpumarket_nodes_simulated 2" in body
        )
        assert paused >= 1, output
        assert "SIMULATED nodes" in output and "alice" in output  # the printed logins
        # A line per round on the console; the requests the server answered (the agents post
        # every few seconds) are in logs/web.log, not on the console.
        assert re.search(r"^round \d+: open for bids until", output, re.MULTILINE), output
        assert "/api/v1/telemetry/ingest" not in output
        web_log = (tmp_path / "var" / "logs" / "web.log").read_text()
        assert "/api/v1/telemetry/ingest" in web_log
        database = tmp_path / "var" / "gpumarket.sqlite3"
        assert database.exists()
        orders, bids = _orders_and_bids(database, deadline)
        assert {team for team, _name, _deadline, _gang in orders} == {
            "Vision Lab",
            "Language Group",
        }
        for team in ("Vision Lab", "Language Group"):
            mine = [o for o in orders if o[0] == team]
            assert 2 <= len(mine) <= 3, orders
        assert any(has_deadline for _t, _n, has_deadline, _g in orders), orders
        assert any(gang for _t, _n, _d, gang in orders), orders
        # The rounds' bids are the orders' own: no bot places any.
        assert bids and all(order_id is not None for _round, order_id in bids), bids
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
        log.close()


def _orders_and_bids(database, deadline):
    """(team, name, has a deadline, is a gang) of every order, and (round, order) of every
    bid, read from the demo's database once a round has the orders' bids."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30) as db:
        while True:
            orders = db.execute(
                "SELECT t.name, o.name, o.deadline IS NOT NULL, o.min_gpus > 1 "
                "FROM market_order o JOIN tenants_tenant t ON t.id = o.tenant_id"
            ).fetchall()
            bids = db.execute("SELECT round_id, order_id FROM market_bid").fetchall()
            if bids or time.monotonic() > deadline:
                return orders, bids
            time.sleep(1)


@pytest.mark.django_db
def test_the_demo_seed_makes_each_teams_orders_once_and_they_win_rounds(tmp_path):
    now = timezone.now()
    demo._seed(tmp_path)
    demo._seed(tmp_path)  # every start seeds again

    orders = list(Order.objects.select_related("tenant").order_by("pk"))
    assert sorted(o.tenant.name for o in orders) == sorted(spec.tenant for spec in DEMO_ORDERS)
    for team in ("Vision Lab", "Language Group"):
        mine = [o for o in orders if o.tenant.name == team]
        assert 2 <= len(mine) <= 3
        assert any(o.deadline is not None for o in mine)
        assert any(o.min_gpus > 1 for o in mine)
    for order in orders:
        if order.deadline is not None:
            assert now + timedelta(hours=12) < order.deadline < now + timedelta(days=2)

    # The capacity the demo's simulated nodes report for their tiers (telemetry sets it).
    for _node, slug, gpus in demo.NODES:
        tier_capacity_set(tier=Tier.objects.get(slug=slug), capacity=gpus)
    opened = rounds_tick(now=now)
    rnd = Round.objects.get(pk=opened.open_round)
    assert sorted(rnd.bids.values_list("order_id", flat=True)) == [o.pk for o in orders]

    rounds_tick(now=rnd.closes_at + timedelta(seconds=1))

    won = Bid.objects.filter(round=rnd, status=Bid.Status.WON)
    assert sorted(won.values_list("order_id", flat=True)) == [o.pk for o in orders]
    assert Order.objects.filter(status=Order.Status.ACTIVE).count() == len(orders)


def test_the_demos_worker_and_web_share_one_cache(tmp_path):
    """What the demo's worker caches (the forecast it makes after a settlement) is read by
    its web process: two processes with the demo's environment, one writes, the other reads."""
    env = {k: v for k, v in os.environ.items() if k not in ("CACHE_URL", "GPUMARKET_CACHE_DIR")}
    env.update(GPUMARKET_VAR_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    script = (
        "from gpumarket import demo; demo._environment_set(); import django; django.setup(); "
        "from django.core.cache import cache; import sys; "
        "cache.set('forecast', 42) if sys.argv[1] == 'set' else print(cache.get('forecast'))"
    )
    for step in ("set", "get"):
        done = subprocess.run(
            [sys.executable, "-c", script, step],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert (tmp_path / "cache").is_dir()
