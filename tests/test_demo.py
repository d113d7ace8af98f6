"""The README's first command: ``gpumarket demo`` brings the whole embedded platform up.

Runs the real command (SQLite, the file broker, worker with beat, two simulated agents) in a
temporary folder and reads what a visitor would see: the login page, both simulated nodes
reporting, and the enforcement loop pausing the process that has no allocation.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import requests

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
        while time.monotonic() < deadline and not (healthy == 2 and paused >= 1):
            body = requests.get(f"{base}/metrics", timeout=30).text
            healthy = _metric(body, "gpumarket_nodes", 'state="healthy"')
            paused = _metric(
                body, "gpumarket_enforcement_actions", 'action="pause",state="acknowledged"'
            )
            time.sleep(1)
        log.flush()
        output = (tmp_path / "demo.log").read_text()
        assert healthy == 2, output
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
        assert (tmp_path / "var" / "gpumarket.sqlite3").exists()
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
        log.close()
