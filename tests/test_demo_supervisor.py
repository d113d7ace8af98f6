"""The demo starts its worker and agents again when one stops, and says so; it starts one
simulated job per order and node, and a second only once the first has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gpumarket import demo


def _wait_stopped(children: demo.Children, name: str) -> int:
    deadline = time.monotonic() + 10
    while children.procs[name].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return children.procs[name].poll()


def test_a_child_that_stops_is_started_again_and_the_console_says_so(tmp_path):
    children = demo.Children(log_dir=tmp_path, env=dict(os.environ))
    children.start("worker", [sys.executable, "-c", "print('ran'); raise SystemExit(3)"])
    children.start("agent", [sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        first = children.procs["worker"]
        assert _wait_stopped(children, "worker") == 3

        lines = children.revive()

        assert lines == [f"worker stopped (exit 3); started again, see {tmp_path / 'worker.log'}"]
        assert children.procs["worker"] is not first
        assert children.procs["agent"].poll() is None  # a running child is left alone
        _wait_stopped(children, "worker")
        assert (tmp_path / "worker.log").read_text().count("ran") == 2
    finally:
        children.stop()


def test_a_child_that_keeps_stopping_is_left_stopped_after_the_restarts(tmp_path):
    children = demo.Children(log_dir=tmp_path, env=dict(os.environ))
    children.start("worker", [sys.executable, "-c", "raise SystemExit(1)"])
    said = []
    try:
        for _ in range(demo.RESTARTS + 3):
            _wait_stopped(children, "worker")
            said += children.revive()
    finally:
        children.stop()

    assert len(said) == demo.RESTARTS + 1
    assert said[-1].startswith("worker stopped again (exit 1); left stopped")


def test_stopping_the_demo_does_not_restart_what_it_stops(tmp_path):
    children = demo.Children(log_dir=tmp_path, env=dict(os.environ))
    children.start("agent", [sys.executable, "-c", "import time; time.sleep(30)"])

    children.stop()

    assert children.procs["agent"].poll() is not None
    assert children.revive() == []


class _Spawn:
    """Stands in for spawn_simulated_work: a real process that sleeps, per call."""

    def __init__(self):
        self.calls = []

    def __call__(self, node, gpu, *, duty, extra_env):
        self.calls.append((node, gpu, extra_env))
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_an_orders_job_is_started_once_and_again_only_after_it_ended():
    spawn = _Spawn()
    jobs = demo.Jobs(spawn=spawn)
    key = ("order", 7, "sim-node-a")
    try:
        assert jobs.needs(key)
        jobs.start(key, {"GPUMARKET_LAUNCH": "round-1"})
        first = jobs.procs[key]

        # The order wins the next round on the same node: its process runs on, even while
        # suspended after a lost round.
        assert not jobs.needs(key)
        os.kill(first.pid, signal.SIGSTOP)
        assert not jobs.needs(key)
        os.kill(first.pid, signal.SIGCONT)
        assert jobs.needs(("order", 7, "sim-node-b"))  # another node is another job
        assert jobs.needs(("order", 8, "sim-node-a"))

        first.terminate()
        first.wait(timeout=10)
        assert jobs.needs(key)
        jobs.start(key, {"GPUMARKET_LAUNCH": "round-3"})
        assert jobs.procs[key] is not first
        assert [env for _node, _gpu, env in spawn.calls] == [
            {"GPUMARKET_LAUNCH": "round-1"},
            {"GPUMARKET_LAUNCH": "round-3"},
        ]
        assert spawn.calls[0][:2] == ("sim-node-a", None)  # its GPUs come from the launch env
    finally:
        jobs.stop()


def test_a_hand_placed_allocations_job_runs_once():
    jobs = demo.Jobs(spawn=_Spawn())
    key = ("allocation", 3, "sim-node-b")
    try:
        jobs.start(key, {})
        jobs.procs[key].terminate()
        jobs.procs[key].wait(timeout=10)

        assert not jobs.needs(key)
    finally:
        jobs.stop()


def test_stopping_the_demo_ends_its_jobs():
    jobs = demo.Jobs(spawn=_Spawn())
    jobs.start(("order", 1, "sim-node-a"), {})

    jobs.stop()

    assert jobs.procs[("order", 1, "sim-node-a")].wait(timeout=10) is not None
