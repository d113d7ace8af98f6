"""Fixtures for the agent's tests: real child processes and a stand-in ingest server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from telemetry.agent.procmap import stat_read


def _wait_until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _process_state(pid: int) -> str | None:
    stat = stat_read(pid)
    return None if stat is None else stat.state


@pytest.fixture
def wait_until() -> Callable[..., bool]:
    """Poll a condition about a real process, which changes on the kernel's schedule."""
    return _wait_until


@pytest.fixture
def process_state() -> Callable[[int], str | None]:
    """The one-letter state of a pid from /proc (R, S, T, Z...), None once it is gone."""
    return _process_state


@dataclass
class Children:
    """Child processes started by a test; every one is killed (by group) at teardown."""

    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add(self, child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.started.append(child)
        return child

    def python(self, code: str, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A `python -c code` child in its own session, like a batch job."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            env=full_env,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        return self.add(child)

    def cleanup(self) -> None:
        for child in self.started:
            # The group for children in a session of their own, the pid for the rest.
            for kill in (os.killpg, os.kill):
                try:
                    kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            child.wait(timeout=5)
            if child.stdout is not None:
                child.stdout.close()


@pytest.fixture
def children() -> Iterator[Children]:
    tracked = Children()
    yield tracked
    tracked.cleanup()


@pytest.fixture
def sim_node() -> str:
    # A node name of its own per test, so a slow-dying worker of another test is never seen.
    return f"t{uuid.uuid4().hex[:8]}"


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    status: int


class StandInIngest:
    """Enough of the ingest endpoint to drive the loop: records every POST and answers with
    `status` (and, on 200, the next queued list of directives)."""

    def __init__(self) -> None:
        self.status = 200
        self.delay_seconds = 0.0
        self.received: list[Received] = []
        self.directives: list[list[dict[str, Any]]] = []
        self.seen_batch_ids: set[str] = set()
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def delivered(self) -> list[dict[str, Any]]:
        """Bodies the stand-in accepted (answered 200), in arrival order."""
        with self.lock:
            return [entry.body for entry in self.received if entry.status == 200]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [entry.body for entry in self.received]

    def start(self, *, port: int = 0) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server naming
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if stand_in.delay_seconds:
                    time.sleep(stand_in.delay_seconds)
                with stand_in.lock:
                    status = stand_in.status
                    if self.path != "/api/v1/telemetry/ingest":
                        status = 404
                    stand_in.received.append(
                        Received(body=body, headers=dict(self.headers), status=status)
                    )
                    if status == 200:
                        duplicate = body["batch_id"] in stand_in.seen_batch_ids
                        stand_in.seen_batch_ids.add(body["batch_id"])
                        directives = stand_in.directives.pop(0) if stand_in.directives else []
                        answer: dict[str, Any] = {
                            "stored": 0 if duplicate else len(body["samples"]),
                            "duplicate": duplicate,
                            "directives": directives,
                        }
                    else:
                        answer = {"errors": {"samples": ["refused by the stand-in"]}}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def ingest() -> Iterator[StandInIngest]:
    server = StandInIngest()
    server.start()
    yield server
    server.stop()
