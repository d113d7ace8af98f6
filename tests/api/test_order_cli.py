"""Standing orders from the Python client and the `gpumarket order` / `gpumarket run --order`
commands, against a live server (real HTTP, the commands as real subprocesses)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpumarket.client import ApiError, Client
from market.models import Bid, Order
from tests.api.world import TIER, world_build

ROOT = Path(__file__).resolve().parents[2]
PRINT_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('CUDA_VISIBLE_DEVICES', 'GPUMARKET_ALLOCATION', 'GPUMARKET_LAUNCH_TOKEN')}))"
)


@pytest.fixture
def live_world(transactional_db, live_server):
    return world_build()


def _gm(live_server, token: str, *args: str):
    return subprocess.run(
        [sys.executable, "-m", "gpumarket", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GPUMARKET_TOKEN": token, "GPUMARKET_URL": live_server.url},
    )


def test_client_creates_edits_pauses_and_cancels_an_order(live_world, live_server):
    client = Client(live_server.url, live_world.a.token)
    order = client.create_order(
        name="sweep", values={TIER: "2.5"}, gpus=1, gpu_hours=3, ceiling=Decimal("40")
    )
    assert (order["values"], order["gpu_hours_wanted"], order["ceiling"]) == (
        {TIER: "2.500"},
        3.0,
        "40.000",
    )
    assert order["id"] in {o["id"] for o in client.orders(status="active")}
    assert client.order(order["id"])["name"] == "sweep"
    edited = client.edit_order(order["id"], values={TIER: "3"}, gpu_hours=None)
    assert edited["values"] == {TIER: "3.000"} and edited["gpu_hours_wanted"] is None
    assert client.pause_order(order["id"])["status"] == "paused"
    assert client.resume_order(order["id"])["status"] == "active"
    assert client.cancel_order(order["id"])["status"] == "cancelled"
    with pytest.raises(ApiError) as refused:
        client.create_order(name="x", values={TIER: "2.5"}, gpus=1, ceiling="0.001")
    assert refused.value.status == 409 and "ceiling" in refused.value.fields
    with pytest.raises(ApiError) as foreign:
        client.order(live_world.b.order.pk)
    assert foreign.value.status == 404


def test_the_order_command(live_world, live_server):
    token = live_world.a.token
    assert "create" in _gm(live_server, token, "order", "--help").stdout
    assert "order ACTION" in _gm(live_server, token, "--help").stdout
    made = _gm(
        live_server,
        token,
        "order",
        "--json",
        "create",
        "--name",
        "nightly",
        "--value",
        f"{TIER}=2.5",
        "--gpus",
        "1",
        "--gpu-hours",
        "4",
        "--ceiling",
        "50",
        "--command",
        "python train.py",
    )
    assert made.returncode == 0, made.stderr
    order = json.loads(made.stdout)
    assert Order.objects.get(pk=order["id"]).gpu_seconds_wanted == 4 * 3600
    listed = _gm(live_server, token, "order", "list")
    assert f"#{order['id']} nightly [active] 0/4 GPU-h, spent 0.000/50.000 credits" in listed.stdout
    shown = _gm(live_server, token, "order", "show", str(order["id"]))
    assert f"gpumarket run --order {order['id']} -- python train.py" in shown.stdout
    edited = _gm(live_server, token, "order", "edit", str(order["id"]), "--until-cancelled")
    assert edited.returncode == 0 and "until cancelled" in edited.stdout
    assert "[paused]" in _gm(live_server, token, "order", "pause", str(order["id"])).stdout
    refused = _gm(live_server, token, "order", "edit", str(order["id"]), "--ceiling", "0.001")
    assert refused.returncode == 2 and "refused: ceiling:" in refused.stderr
    assert _gm(live_server, token, "order", "show", str(live_world.b.order.pk)).returncode == 2
    bad = _gm(
        live_server,
        token,
        "order",
        "create",
        "--name",
        "x",
        "--value",
        "a100",
        "--gpus",
        "1",
        "--ceiling",
        "5",
    )
    assert bad.returncode == 2 and "TIER=CREDITS" in bad.stderr


def test_run_order_starts_the_command_on_the_orders_allocation(live_world, live_server):
    world = live_world
    client = Client(live_server.url, world.a.token)
    order = client.create_order(
        name="run", values={TIER: "2.5"}, gpus=1, ceiling="40", command=f"{sys.executable} -c x"
    )
    idle = _gm(
        live_server,
        world.a.token,
        "run",
        "--order",
        str(order["id"]),
        "--node",
        "node-1",
        "--",
        sys.executable,
        "-c",
        PRINT_ENV,
    )
    assert idle.returncode == 2 and "holds no GPUs on node-1" in idle.stderr
    # The settled allocation running now stands for one the order won, placed on node-1.
    allocation = world.a.allocation
    Bid.objects.filter(pk=allocation.bid_id).update(order_id=order["id"])
    allocation.placement = [{"node": "node-1", "index": i, "uuid": f"GPU-{i}"} for i in (2, 3)]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    ran = _gm(
        live_server,
        world.a.token,
        "run",
        "--order",
        str(order["id"]),
        "--node",
        "node-1",
        "--",
        sys.executable,
        "-c",
        PRINT_ENV,
    )
    assert ran.returncode == 0, ran.stderr
    env = json.loads(ran.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["GPUMARKET_ALLOCATION"] == str(allocation.pk)
    assert env["GPUMARKET_LAUNCH_TOKEN"]
    # With no command given, the order's own runs (here: a script that fails on purpose).
    own = _gm(live_server, world.a.token, "run", "--order", str(order["id"]), "--node", "node-1")
    assert f"order {order['id']}, allocation {allocation.pk} on node-1" in own.stderr
    assert "NameError" in own.stderr
    foreign = _gm(
        live_server,
        world.a.token,
        "run",
        "--order",
        str(world.b.order.pk),
        "--node",
        "node-1",
        "--print-env",
    )
    assert foreign.returncode == 2 and "not one of your team's orders" in foreign.stderr


FOLLOWED = (
    "import os, time\n"
    "with open(os.environ['OUT'], 'a') as out:\n"
    "    out.write(f\"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n\")\n"
    "time.sleep(600)\n"
)


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _until(predicate, seconds: float = 30) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_run_follow_starts_the_work_again_where_the_order_moved_and_ends_with_it(
    live_world, live_server, tmp_path
):
    import signal

    from market.models import Allocation

    world = live_world
    client = Client(live_server.url, world.a.token)
    order = client.create_order(name="follow", values={TIER: "2.5"}, gpus=2, ceiling="40")
    allocation = world.a.allocation
    Bid.objects.filter(pk=allocation.bid_id).update(order_id=order["id"])
    allocation.placement = [{"node": "node-1", "index": i, "uuid": f"GPU-{i}"} for i in (2, 3)]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    out = tmp_path / "runs.txt"
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpumarket", "run", "--order", str(order["id"]), "--node",
         "node-1", "--follow", "--poll", "0.2", "--", sys.executable, "-c", FOLLOWED],
        cwd=ROOT,
        env={**os.environ, "GPUMARKET_TOKEN": world.a.token, "GPUMARKET_URL": live_server.url,
             "OUT": str(out)},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert _until(lambda: len(_lines(out)) == 1), follower.stderr
        first_pid, gpus = _lines(out)[0]
        assert gpus == "2,3"
        # The order now holds GPUs 0 and 1; enforcement stops the copy on the old ones.
        allocation.placement = [{"node": "node-1", "index": i, "uuid": f"GPU-{i}"} for i in (0, 1)]
        allocation.save()
        os.kill(int(first_pid), signal.SIGTERM)
        assert _until(lambda: len(_lines(out)) == 2)
        second_pid, gpus = _lines(out)[1]
        assert gpus == "0,1" and second_pid != first_pid
        # The order ends; its window with it; the work is stopped; the follower is done.
        client.cancel_order(order["id"])
        Allocation.objects.filter(pk=allocation.pk).update(status="finished")
        os.kill(int(second_pid), signal.SIGTERM)
        assert follower.wait(timeout=30) == 0
        assert "is cancelled; nothing more to run here" in follower.stderr.read()
        assert len(_lines(out)) == 2
    finally:
        if follower.poll() is None:
            follower.kill()
