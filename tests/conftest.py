"""Shared test fixtures.

Tests run against real PostgreSQL and Redis (see README, "Tests"). A missing service fails
the run loudly instead of skipping what needs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("GPUMARKET_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def pytest_configure(config):
    # The Celery worker started by tests must see the same broker as the code under test.
    os.environ.setdefault("CELERY_BROKER_URL", REDIS_URL)


@pytest.fixture(scope="session", autouse=True)
def _require_postgresql(django_db_blocker):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.exit(
            "The test suite needs PostgreSQL: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/"
            "gpumarket (the README's test command does this and starts the server).",
            returncode=3,
        )


def _redis_ping(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable", said loudly
        pytest.fail(f"Redis is required at {url} and is not reachable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def redis_url() -> str:
    _redis_ping(REDIS_URL)
    return REDIS_URL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for subprocesses (workers, agents)."""
    from django.db import connection

    s = connection.settings_dict
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class CeleryWorker:
    """A real Celery worker process on the test database and a Redis broker."""

    def __init__(
        self,
        *,
        database_url: str,
        broker_url: str,
        log_path: Path,
        queues: str = "clearing,telemetry,default",
        extra_env: dict[str, str] | None = None,
        pool: str = "solo",
        options: tuple[str, ...] = ("--without-gossip", "--without-mingle", "--without-heartbeat"),
    ) -> None:
        self.pool = pool
        self.options = options
        self.database_url = database_url
        self.broker_url = broker_url
        self.log_path = log_path
        self.queues = queues
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            CELERY_BROKER_URL=self.broker_url,
            DEBUG="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                self.queues,
                "--pool",
                self.pool,
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                *self.options,
            ],
            cwd=ROOT,
            env=self.env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Ready when the worker answers a ping over the broker.
        from celery import Celery

        app = Celery(broker=self.broker_url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited early; see {self.log_path}")
            if app.control.ping(timeout=0.5):
                return
        raise RuntimeError(f"celery worker did not answer within 60 s; see {self.log_path}")

    def stop(self, *, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "log", None):
            self.log.close()


@pytest.fixture
def celery_worker_process(transactional_db, redis_url, tmp_path) -> Iterator[CeleryWorker]:
    """Start a real worker (needs ``transactional_db`` so it sees committed rows).

    The broker's test database is flushed first so no message from another test leaks in.
    """
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    worker = CeleryWorker(
        database_url=test_database_url(), broker_url=redis_url, log_path=tmp_path / "worker.log"
    )
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


class SentTasks(list):
    """The tasks the code under test sent by name, as (name, args), none of them delivered."""

    def of(self, name: str) -> list:
        """The args of each send of ``name``, in order."""
        return [args for sent, args in self if sent == name]


@pytest.fixture
def sent_tasks(monkeypatch) -> SentTasks:
    """Record what services queue by name (``current_app.send_task``) instead of sending it;
    each name recorded is checked to be a registered task, so a typo cannot pass."""
    from celery import Celery

    from config.celery import app

    app.loader.import_default_modules()
    sent = SentTasks()

    def send_task(_app, name, args=None, kwargs=None, **_options):
        assert name in app.tasks, f"no task is registered as {name!r}"
        sent.append((name, list(args or [])))

    # On the class: a live server's thread may see another app object as current_app.
    monkeypatch.setattr(Celery, "send_task", send_task)
    return sent
