"""Hand-off (issue 11 item 3): the API and the client show where an allocation is placed and
a ready command, and `gpumarket run` starts a command with its GPUs and launch token, or
refuses saying why. Against a live server (real HTTP), the command as a real subprocess."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gpumarket.client import ApiError, Client
from market.models import Allocation
from market.placement.launch import launch_token_valid
from tests.api.world import world_build

ROOT = Path(__file__).resolve().parents[2]
PRINT_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('CUDA_VISIBLE_DEVICES', 'GPUMARKET_ALLOCATION', 'GPUMARKET_LAUNCH_TOKEN')}))"
)


def _place(allocation: Allocation, node: str, indices: list[int]) -> Allocation:
    allocation.placement = [{"node": node, "index": i, "uuid": f"GPU-{node}-{i}"} for i in indices]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    return allocation


@pytest.fixture
def live_world(transactional_db, live_server):
    world = world_build()
    _place(world.a.allocation, "node-1", [2, 3])
    _place(world.b.allocation, "node-1", [0, 1])
    return world


def _run(live_server, token: str, *args: str, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "gpumarket", "run", "--url", live_server.url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GPUMARKET_TOKEN": token, **(env or {})},
    )


def test_the_api_shows_the_placement_and_a_ready_command(live_world, live_server):
    world = live_world
    client = Client(live_server.url, world.a.token)
    allocation = client.allocation(world.a.allocation.pk)
    assert [(g["node"], g["index"]) for g in allocation["placement"]] == [
        ("node-1", 2),
        ("node-1", 3),
    ]
    assert allocation["ready_commands"] == [
        f"gpumarket run --allocation {world.a.allocation.pk} --node node-1 -- python train.py"
    ]
    launch = client.launch(world.a.allocation.pk, node="node-1")
    assert launch["gpus"] == [2, 3]
    assert launch["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert launch["env"]["GPUMARKET_ALLOCATION"] == str(world.a.allocation.pk)
    assert launch_token_valid(
        launch["env"]["GPUMARKET_LAUNCH_TOKEN"],
        secret=world.a.allocation.launch_secret,
        allocation_id=world.a.allocation.pk,
        node="node-1",
        uuids=launch["uuids"],
    )
    assert "launch_secret" not in json.dumps(allocation)

    with pytest.raises(ApiError) as foreign:
        client.launch(world.b.allocation.pk, node="node-1")
    assert foreign.value.status == 404
    with pytest.raises(ApiError) as elsewhere:
        client.launch(world.a.allocation.pk, node="node-9")
    assert "runs on node-1 GPUs 2, 3, not on node 'node-9'" in elsewhere.value.message
    with pytest.raises(ApiError) as no_node:
        client.request("GET", f"/allocations/{world.a.allocation.pk}/launch")
    assert no_node.value.status == 400 and "node" in no_node.value.fields


def test_gpumarket_run_starts_the_command_on_its_gpus_with_the_token(live_world, live_server):
    world = live_world
    pk = world.a.allocation.pk
    done = _run(
        live_server,
        world.a.token,
        "--allocation",
        str(pk),
        "--",
        sys.executable,
        "-c",
        PRINT_ENV,
        env={"GPUMARKET_NODE": "node-1"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert seen["GPUMARKET_ALLOCATION"] == str(pk)
    assert launch_token_valid(
        seen["GPUMARKET_LAUNCH_TOKEN"],
        secret=world.a.allocation.launch_secret,
        allocation_id=pk,
        node="node-1",
        uuids=["GPU-node-1-2", "GPU-node-1-3"],
    )


def test_gpumarket_run_refuses_saying_why(live_world, live_server):
    world = live_world
    a, b = world.a.allocation.pk, world.b.allocation.pk
    command = ["--", sys.executable, "-c", "print('ran')"]

    theirs = _run(live_server, world.a.token, "--allocation", str(b), "--node", "node-1", *command)
    assert theirs.returncode == 2 and "ran" not in theirs.stdout
    assert f"allocation {b} is not one of your team's allocations" in theirs.stderr

    here = _run(live_server, world.a.token, "--allocation", str(a), "--node", "node-2", *command)
    assert here.returncode == 2
    assert f"allocation {a} runs on node-1 GPUs 2, 3, not on node 'node-2'" in here.stderr

    Allocation.objects.filter(pk=a).update(status=Allocation.Status.FINISHED)
    ended = _run(live_server, world.a.token, "--allocation", str(a), "--node", "node-1", *command)
    assert ended.returncode == 2
    assert f"allocation {a} is ended, not active" in ended.stderr

    nothing = _run(live_server, world.a.token, "--allocation", str(a))
    assert nothing.returncode == 2 and "give the command after --" in nothing.stderr
