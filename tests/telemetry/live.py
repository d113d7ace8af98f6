"""Real processes for end-to-end tests: the web app under gunicorn, a node agent, and a
stand-in for celery beat that sends ``telemetry.enforce`` through the broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tests.conftest import ROOT, free_port


def wait_until(predicate: Callable[[], bool], *, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def process_state(pid: int) -> str | None:
    """The state letter in /proc/<pid>/stat ("T" = stopped), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return text[text.rfind(")") + 2]


def _stop_group(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class LiveServer:
    """The Django app under gunicorn on 127.0.0.1, on the test database.

    One worker by default: the readiness probe then also loads its URLconf (which Django does
    on a worker's first request, and which takes seconds), so the agent's first post does not
    stall behind it.
    """

    def __init__(self, *, database_url: str, broker_url: str, log_path: Path, workers: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.broker_url = broker_url
        self.log_path = log_path
        self.workers = workers
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            CELERY_BROKER_URL=self.broker_url,
            DEBUG="1",
            PYTHONUNBUFFERED="1",
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "config.wsgi",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    str(self.workers),
                    "--graceful-timeout",
                    "5",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited early; see {self.log_path}")
            try:
                return (
                    requests.get(self.url + "/api/v1/telemetry/ingest", timeout=1).status_code
                    == 405
                )
            except requests.RequestException:
                return False

        if not wait_until(ready, timeout=30):
            raise RuntimeError(f"gunicorn did not answer within 30 s; see {self.log_path}")

    def stop(self) -> None:
        _stop_group(self.proc)
        self.proc = None


class AgentProcess:
    """``python -m gpumarket agent --backend simulated`` against a live server."""

    def __init__(
        self,
        *,
        server: str,
        token: str,
        node_name: str,
        log_path: Path,
        interval: float = 1.0,
        gpus: int = 2,
        executor: str = "signal",
    ):
        self.args = [
            sys.executable,
            "-m",
            "gpumarket",
            "agent",
            "--server",
            server,
            "--backend",
            "simulated",
            "--node-name",
            node_name,
            "--sim-gpus",
            str(gpus),
            "--interval",
            str(interval),
            "--executor",
            executor,
            "--timeout",
            "5",
        ]
        self.token = token
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, GPUMARKET_NODE_TOKEN=self.token, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop_group(self.proc)


class BeatTicks:
    """Sends ``telemetry.enforce`` to the worker every ``seconds``, as beat would."""

    def __init__(self, *, broker_url: str, seconds: float):
        from celery import Celery

        self.app = Celery(broker=broker_url)
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.app.send_task("telemetry.enforce", queue="telemetry")
            self._stop.wait(self.seconds)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.app.close()
