"""The demo starts its worker and agents again when one stops, and says so."""

from __future__ import annotations

import os
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
