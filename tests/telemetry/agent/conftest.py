"""Fixtures for the agent's tests: real child processes and a stand-in ingest server."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.procmap import environ_read, stat_read


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
        # Popen returns once exec has begun, but the kernel sets the new program's environment
        # up a moment later: /proc/PID/environ reads empty, or without the variables given
        # here, in between (both seen in CI). The agent reads it again next interval; a test
        # that reads it once waits here until the child's own environment shows.
        self.add(child)
        wanted = env or {}

        def environment_shows_or_ended() -> bool:
            # A child that ends at once ("pass") never shows one: a zombie reads empty. Its
            # state is read from /proc, not by polling, so a zombie stays unreaped.
            if _process_state(child.pid) in (None, "Z"):
                return True
            seen = environ_read(child.pid) or {}
            return bool(seen) and all(seen.get(key) == value for key, value in wanted.items())

        _wait_until(environment_shows_or_ended)
        return child

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


# Records its arguments, one JSON list per line. For `<verb> <job>` it
# answers like scontrol does for a job the controller no longer knows (job 404) or a refused
# operation (job 500). For `show job <id> ...` it prints the record the test wrote to
# jobs/<id>, else fails like scontrol for a job it does not know, or (job 500) for a
# controller it cannot reach. `requeuehold`, `hold` and `release` change that record the way
# the controller shows the job afterwards.
SCONTROL_STAND_IN = """#!/bin/sh
printf '%s\\n' "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@")" >> "{log}"
if [ "$1" = show ]; then
  if [ -f "{jobs}/$3" ]; then cat "{jobs}/$3"; exit 0; fi
  case "$3" in
    500) echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  esac
  echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
fi
case "$2" in
  404) echo "scontrol: error: Invalid job id specified" >&2; exit 1 ;;
  500) echo "scontrol: error: Access/permission denied" >&2; exit 1 ;;
esac
if [ -f "{jobs}/$2" ]; then
  case "$1" in
    requeuehold)
      if grep -q "Requeue=0" "{jobs}/$2"; then
        echo "Requested operation is presently disabled for job $2" >&2; exit 1
      fi
      sed -i 's/JobState=[A-Z]*/JobState=PENDING/; s/Reason=[^ ]*/Reason=job_requeued_in_held_state/' "{jobs}/$2" ;;
    hold) sed -i 's/Reason=[^ ]*/Reason=JobHeldAdmin/' "{jobs}/$2" ;;
    release) sed -i 's/Reason=[^ ]*/Reason=None/' "{jobs}/$2" ;;
  esac
fi
exit 0
"""


# `scancel [--signal=<sig> --full] <job>`: recorded in the same log, prefixed "scancel"; job 404
# is unknown to the controller, job 500 a refusal. Cancelling writes JobState=CANCELLED into
# the job's record, as the controller shows it afterwards.
SCANCEL_STAND_IN = """#!/bin/sh
printf '%s\\n' "$(python3 -c 'import json,sys; print(json.dumps(["scancel"] + sys.argv[1:]))' "$@")" >> "{log}"
for job; do :; done
case "$job" in
  404) echo "scancel: error: Kill job error on job id 404: Invalid job id specified" >&2; exit 1 ;;
  500) echo "scancel: error: Kill job error on job id 500: Access/permission denied" >&2; exit 1 ;;
esac
case "$1" in
  --signal=*) ;;
  *) if [ -f "{jobs}/$job" ]; then sed -i 's/JobState=[A-Z]*/JobState=CANCELLED/' "{jobs}/$job"; fi ;;
esac
exit 0
"""


class StandInScontrol:
    """`scontrol` and `scancel` on PATH; calling it gives the argument lists they were run
    with (scancel's prefixed "scancel")."""

    def __init__(self, directory: Path) -> None:
        self.bin_dir = directory / "bin"
        self.jobs_dir = directory / "jobs"
        self.log = directory / "scontrol.log"
        self.bin_dir.mkdir()
        self.jobs_dir.mkdir()
        for name, text in (("scontrol", SCONTROL_STAND_IN), ("scancel", SCANCEL_STAND_IN)):
            script = self.bin_dir / name
            script.write_text(text.format(log=self.log, jobs=self.jobs_dir))
            script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def __call__(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def job(
        self,
        job_id: str,
        *,
        comment: str = "(null)",
        state: str = "RUNNING",
        reason: str = "None",
        requeue: bool = True,
    ) -> None:
        """A job the controller knows, shown the way `--oneliner` prints it."""
        (self.jobs_dir / job_id).write_text(
            f"JobId={job_id} JobName=train UserId=alice(1000) GroupId=alice(1000) "
            f"Priority=4294901755 JobState={state} Reason={reason} RunTime=00:01:02 Partition=gpu "
            f"Requeue={int(requeue)} NodeList=gpu-node-07 Command=/home/alice/train.sh "
            f"WorkDir=/home/alice "
            f"AdminComment=gpumarket:allocation=999 Comment={comment} "
            f"StdErr=/home/alice/slurm-{job_id}.out Power=\n"
        )


@pytest.fixture
def scontrol(tmp_path, monkeypatch) -> StandInScontrol:
    stand_in = StandInScontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{stand_in.bin_dir}:{os.environ['PATH']}")
    return stand_in


@dataclass
class StandInApi:
    """The Kubernetes API calls the agent makes (read a pod, patch a Job), on 127.0.0.1."""

    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    patches: list[dict[str, Any]] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    url: str = ""

    def client(self) -> Any:
        # Imported here: the Kubernetes client is slow to import and most tests never need it.
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.url))

    def pod_labelled(self, namespace: str, pod: str, labels: dict[str, str]) -> None:
        self.pods[(namespace, pod)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace, "labels": labels},
        }

    def pod_of_job(self, namespace: str, pod: str, job: str) -> None:
        self.pods[(namespace, pod)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": namespace,
                "labels": {"batch.kubernetes.io/job-name": job},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job,
                        "uid": "u-1",
                        "controller": True,
                    }
                ],
            },
        }
        self.jobs.add((namespace, job))


def _not_found(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": f'{kind} "{name}" not found',
        "reason": "NotFound",
        "code": 404,
    }


@pytest.fixture
def api() -> Iterator[StandInApi]:
    state = StandInApi()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802
            state.reads.append(self.path.split("?")[0])
            parts = self.path.split("?")[0].strip("/").split("/")
            # api/v1/namespaces/<ns>/pods/<name>
            if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                pod = state.pods.get((parts[3], parts[5]))
                if pod is not None:
                    return self._answer(200, pod)
            return self._answer(404, _not_found("pods", parts[-1]))

        def do_PATCH(self) -> None:  # noqa: N802
            parts = self.path.split("?")[0].strip("/").split("/")
            # apis/batch/v1/namespaces/<ns>/jobs/<name>
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            namespace, name = parts[4], parts[6]
            state.patches.append(
                {
                    "path": self.path,
                    "content_type": self.headers["Content-Type"],
                    "body": body,
                }
            )
            if (namespace, name) not in state.jobs:
                return self._answer(404, _not_found("jobs.batch", name))
            return self._answer(
                200,
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "suspend": body["spec"]["suspend"],
                        "template": {"spec": {"containers": []}},
                    },
                },
            )

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
