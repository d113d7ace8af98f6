"""Against a real single-node Slurm (issue 11 item 5), which scripts/slurm.sh installs from
Debian's packages and starts (scripts/test runs it): the reservation settlement asks for, a
real `sbatch` job under it, and the agent's Slurm mapping and executor on a real job: its
allocation read from the job's comment, suspended (job state S, its processes in state T) and
resumed on the platform's orders, and cancelled after the grace period when its window ends;
a paused job cancelled at once; and a job whose standing order lost its round sent its
checkpoint signal, requeued and held after the grace, and run again on resume.
No stand-in: if Slurm is not running these tests fail and say how to start it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import Allocation
from market.services.slurm_reservations import (
    reservation_name,
    slurm_account,
    slurm_reservations_create,
    slurm_reservations_end,
)
from market.services.void import round_void
from telemetry.agent.protocol import Directive, DirectiveResult
from telemetry.agent.slurm_executor import SlurmExecutor
from telemetry.models import EnforcementAction
from telemetry.services import node_register
from tenants.ledger import MILLI
from tests import factories
from tests.conftest import CeleryWorker
from tests.conftest import test_database_url as database_url  # aliased: pytest would collect test_*
from tests.telemetry.live import AgentProcess, BeatTicks, LiveServer, process_state, wait_until
from tests.telemetry.market_data import allocation_make, fleet_node, settled_gang

AGENT_SECONDS = 1.0
ENFORCE_SECONDS = 1.5
WITHIN = 3 * ENFORCE_SECONDS + 2 * AGENT_SECONDS + 3  # plus the Slurm round trips
GRACE_SECONDS = 3
KILL_WAIT = 2  # the test cluster's KillWait (scripts/slurm.sh)
# This run's own job name and reservation prefix: the cleanup cancels and deletes only what
# this run made, never a platform's (or another run's) jobs and reservations on the cluster.
JOB_NAME = f"gm-test-{os.getpid()}"
RESERVATION_PREFIX = f"gmtest{os.getpid()}-"


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def slurm_node() -> str:
    """The Slurm node's name; fails (never skips) when Slurm is not up."""
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm's client tools are missing: run `bash scripts/slurm.sh`")
    shown = _run("sinfo", "-h", "-o", "%n %t")
    states = dict(line.split() for line in shown.stdout.splitlines() if line.strip())
    ready = [n for n, state in states.items() if re.match(r"(idle|mix|alloc|comp)$", state)]
    if shown.returncode != 0 or not ready:
        pytest.fail(
            f"Slurm is not taking jobs ({shown.stderr.strip() or states}): run `bash scripts/slurm.sh`"
        )
    return ready[0]


@pytest.fixture
def slurm_cleanup(settings, monkeypatch):
    settings.GPUMARKET_SLURM_RESERVATION_PREFIX = RESERVATION_PREFIX
    # The web app and workers a test starts read it from the environment.
    monkeypatch.setenv("GPUMARKET_SLURM_RESERVATION_PREFIX", RESERVATION_PREFIX)
    yield
    _run("scancel", f"--name={JOB_NAME}")
    for name in _reservations_of_this_run():
        _run("scontrol", "delete", f"reservation={name}")


def _reservations_of_this_run() -> list[str]:
    shown = _run("scontrol", "show", "reservation", "--oneliner")
    return re.findall(rf"ReservationName=({re.escape(RESERVATION_PREFIX)}\d+)", shown.stdout)


def _submit(*args: str, script: str, env: dict[str, str] | None = None) -> str:
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={JOB_NAME}", "-o", "/dev/null", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if submitted.returncode != 0:
        raise AssertionError(submitted.stderr)
    return submitted.stdout.strip().split(";")[0]


def _job(job: str) -> dict[str, str]:
    shown = _run("scontrol", "show", "job", job, "--oneliner")
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout)) if shown.returncode == 0 else {}


def _job_pids(job: str) -> list[int]:
    shown = _run("scontrol", "listpids", job)
    return [int(line.split()[0]) for line in shown.stdout.splitlines()[1:] if line.split()]


def _association(account: str) -> None:
    """Let this Unix user submit under ``account`` (a site does this for its researchers)."""
    user = _run("id", "-un").stdout.strip()
    _run("sacctmgr", "-i", "add", "user", user, f"account={account}")


@pytest.mark.django_db
def test_settlement_reserves_the_node_for_the_team_and_only_its_jobs_get_in(
    slurm_node, slurm_cleanup, tier
):
    fleet_node(name=slurm_node, tier=tier)
    team = factories.tenant(name="Vision Lab", credits=1_000 * MILLI)
    rival = factories.tenant(name="Speech Lab", credits=1_000 * MILLI)
    allocation = settled_gang(tier=tier, tenant=team, user=factories.member(tenant=team))
    assert {g["node"] for g in allocation.placement} == {slurm_node}

    (reserved,) = slurm_reservations_create(allocation_ids=[allocation.pk])
    name = reservation_name(allocation)
    assert reserved.created and reserved.name == name
    assert name.startswith(RESERVATION_PREFIX)  # this run's, which its cleanup deletes
    shown = dict(re.findall(r"(\w+)=(\S*)", _run("scontrol", "show", "reservation", name).stdout))
    assert shown["Nodes"] == slurm_node
    assert shown["Accounts"] == slurm_account(team.slug)
    assert shown["EndTime"] == timezone.localtime(allocation.ends_at).strftime("%Y-%m-%dT%H:%M:%S")
    assert shown["State"] == "ACTIVE"
    # Idempotent: a retried task leaves it as it is.
    (again,) = slurm_reservations_create(allocation_ids=[allocation.pk])
    assert not again.created

    account = slurm_account(team.slug)
    _association(account)
    job = _submit(
        f"--reservation={name}",
        f"--account={account}",
        "--gres=gpu:2",
        script="#!/bin/sh\nsleep 120\n",
    )
    assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=30), _job(job)
    assert _job(job)["NodeList"] == slurm_node and _job(job)["Reservation"] == name

    other = slurm_account(rival.slug)
    _run("sacctmgr", "-i", "add", "account", other, f"Description={other}")
    _association(other)
    with pytest.raises(AssertionError, match="Access denied to requested reservation"):
        _submit(f"--reservation={name}", f"--account={other}", script="#!/bin/sh\nsleep 1\n")

    # The round is voided while the window runs: the reservation ends with the allocations.
    # Slurm will not delete it while the job runs in it, so it is cut short, and no new job
    # of the team gets in. Once its end has passed, slurmctld shows it inactive and, on its
    # own timer, drops it (seen in CI: gone 1.5 s after its end, before a poll saw it).
    round_void(round=allocation.round, actor=None, reason="test: the round was wrong")
    assert slurm_reservations_end(allocation_ids=[allocation.pk]) == [name]
    assert wait_until(lambda: _reservation_state(name) in ("INACTIVE", "gone"), timeout=45), (
        _reservation_state(name)
    )
    with pytest.raises(
        AssertionError, match="Problem using reservation|Requested reservation is invalid"
    ):
        _submit(f"--reservation={name}", f"--account={account}", script="#!/bin/sh\nsleep 1\n")
    _run("scancel", job)
    # Once the job is gone, ending it again deletes it (if Slurm has not already).
    assert wait_until(lambda: _job(job).get("JobState") != "RUNNING", timeout=10)
    assert wait_until(
        lambda: (
            slurm_reservations_end(allocation_ids=[allocation.pk]) in ([name], [])
            and _reservation_state(name) == "gone"
        ),
        timeout=30,
        step=2,
    )


def _reservation_state(name: str) -> str:
    """State=ACTIVE or INACTIVE as scontrol shows it, or "gone"."""
    shown = _run("scontrol", "show", "reservation", name)
    found = re.search(r"State=(\w+)", shown.stdout)
    return found.group(1) if shown.returncode == 0 and found else "gone"


# The job ignores SIGTERM, so what ends it at the window's end is the cancel after the grace.
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    sum(range(20000))\n"
    "    time.sleep(0.05)\n"
)


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_real_slurm_job_is_suspended_resumed_and_cancelled_at_window_end(
    slurm_node, slurm_cleanup, redis_url, tmp_path, tier
):
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    worker = CeleryWorker(
        database_url=database_url(),
        broker_url=redis_url,
        log_path=tmp_path / "worker.log",
        extra_env={"GPUMARKET_PREEMPT_GRACE_SECONDS": str(GRACE_SECONDS)},
    )
    server = LiveServer(
        database_url=database_url(), broker_url=redis_url, log_path=tmp_path / "web.log"
    )
    now = timezone.now()
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    # Won, but its window starts in ten minutes: work on it waits (pause).
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        gpus=1,
        starts_at=now + timedelta(minutes=10),
        ends_at=now + timedelta(hours=1),
    )
    node, token = node_register(name=slurm_node, tier=tier, actor="test")
    worker.start()
    server.start()
    agent = AgentProcess(
        server=server.url,
        token=token,
        node_name=node.name,
        log_path=tmp_path / "agent.log",
        interval=AGENT_SECONDS,
        executor="slurm",  # and --map slurm, its default: the allocation is the job's comment
    )
    agent.start()
    beat = BeatTicks(broker_url=redis_url, seconds=ENFORCE_SECONDS)
    beat.start()
    try:
        job = _submit(
            f"--comment=gpumarket:allocation={allocation.pk}",
            "--export=ALL",
            script=f"#!/bin/sh\nexec {sys.executable} -c '{STUBBORN}'\n",
            env={"GPUMARKET_SIM_NODE": node.name, "GPUMARKET_SIM_GPU": "0"},
        )
        assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=30), _job(job)

        # 1. Its window has not started: suspended through Slurm.
        assert wait_until(lambda: _job(job).get("JobState") == "SUSPENDED", timeout=WITHIN), (
            _job(job),
            agent.log(),
        )
        pids = _job_pids(job)
        assert pids and all(process_state(pid) == "T" for pid in pids), pids
        pause = EnforcementAction.objects.get(action="pause", slurm_job=job)
        assert f"allocation {allocation.pk} starts at" in pause.reason

        # 2. The window starts: resumed.
        Allocation.objects.filter(pk=allocation.pk).update(starts_at=now - timedelta(minutes=1))
        assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=WITHIN), (
            _job(job),
            agent.log(),
        )
        assert wait_until(
            lambda: [process_state(pid) for pid in _job_pids(job)].count("T") == 0, timeout=5
        )
        assert any(process_state(pid) in ("R", "S") for pid in _job_pids(job))

        # 3. The window ends: SIGTERM (ignored by this job), then cancelled after the grace.
        ended = timezone.now()
        Allocation.objects.filter(pk=allocation.pk).update(ends_at=ended)
        assert wait_until(
            lambda: _job(job).get("JobState") == "CANCELLED",
            timeout=WITHIN + GRACE_SECONDS + KILL_WAIT + 5,
        ), (_job(job), agent.log())
        terminate = EnforcementAction.objects.get(action="terminate", slurm_job=job)
        assert wait_until(
            lambda: EnforcementAction.objects.get(pk=terminate.pk).state == "acknowledged",
            timeout=10,
        ), agent.log()
        terminate.refresh_from_db()
        assert terminate.detail == f"job {job} cancelled after {GRACE_SECONDS}s grace"
        assert (terminate.acknowledged_at - ended).total_seconds() >= GRACE_SECONDS
    finally:
        beat.stop()
        agent.stop()
        server.stop()
        worker.stop()


def _directive(
    action: str, job: str, *, directive_id: int, grace: int = GRACE_SECONDS, signal: str = "USR1"
) -> Directive:
    return Directive(
        id=directive_id,
        action=action,
        gpu=None,
        pid=None,
        allocation=None,
        slurm_job=job,
        pod=None,
        namespace=None,
        grace_seconds=grace,
        reason="test",
        checkpoint_signal=signal,
    )


def _outcome(executor: SlurmExecutor, *, timeout: float) -> DirectiveResult | None:
    """The first outcome the executor's poll gives within ``timeout`` seconds."""
    found: list[DirectiveResult] = []
    wait_until(lambda: bool(found.extend(executor.poll()) or found), timeout=timeout, step=0.5)
    return found[0] if found else None


def test_a_suspended_job_is_cancelled_at_once_on_terminate(slurm_node, slurm_cleanup):
    # Slurm never answers `scancel --signal` for a suspended job: the executor must not send
    # one, or the job keeps its GPUs while each retry times out.
    job = _submit(script="#!/bin/sh\nsleep 300\n")
    assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=30), _job(job)
    executor = SlurmExecutor()
    paused = executor.apply(_directive("pause", job, directive_id=1), observed={})
    assert paused is not None and paused.outcome == "done", paused
    assert wait_until(lambda: _job(job).get("JobState") == "SUSPENDED", timeout=10), _job(job)

    started = time.monotonic()
    applied = executor.apply(_directive("terminate", job, directive_id=2), observed={})
    assert time.monotonic() - started < 5, applied
    assert applied is None, applied
    result = _outcome(executor, timeout=KILL_WAIT + 10)

    assert result is not None and result.outcome == "done", (result, _job(job))
    assert _job(job).get("JobState") in ("CANCELLED", None), _job(job)
    assert time.monotonic() - started < KILL_WAIT + 10


def _checkpointing(directory) -> str:
    """A batch script that notes each start, and each SIGUSR1 (its checkpoint), in files in
    ``directory``, and otherwise waits."""
    return (
        "#!/bin/bash\n"
        f"trap 'echo checkpoint >> {directory}/checkpoints' USR1\n"
        f"echo start >> {directory}/starts\n"
        "while true; do sleep 0.2; done\n"
    )


def _node_completing(node: str) -> bool:
    """Whether Slurm still cleans up a job on ``node`` (its state has the completing flag)."""
    state = _run("sinfo", "-h", "-n", node, "-o", "%t").stdout.strip()
    return state.startswith("comp") or state.endswith("comp")


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_running_job_checkpoints_is_requeued_held_and_runs_again_on_resume(
    slurm_node, slurm_cleanup, tmp_path
):
    job = _submit(script=_checkpointing(tmp_path))
    assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=30), _job(job)
    assert wait_until(lambda: _lines(tmp_path / "starts") == ["start"], timeout=10)
    executor = SlurmExecutor()

    started = time.monotonic()
    assert executor.apply(_directive("suspend", job, directive_id=1), observed={}) is None

    assert wait_until(lambda: _lines(tmp_path / "checkpoints") == ["checkpoint"], timeout=5)
    assert executor.poll() == []  # in its grace: still running
    assert _job(job)["JobState"] == "RUNNING"
    result = _outcome(executor, timeout=GRACE_SECONDS + KILL_WAIT + 10)
    assert result is not None, (_job(job), _lines(tmp_path / "checkpoints"))
    assert (result.outcome, result.detail) == (
        "done",
        f"job {job} requeued and held after {GRACE_SECONDS}s grace",
    )
    assert time.monotonic() - started >= GRACE_SECONDS
    held = _job(job)
    assert (held["JobState"], held["Reason"], held["Restarts"]) == (
        "PENDING",
        "job_requeued_in_held_state",
        "1",
    )  # requeued, not cancelled
    assert _job_pids(job) == []  # its GPUs are free
    # The order wins again a window later, not within the second: by then the node has
    # finished cleaning up the requeued run. Released while the node still completes it,
    # the new run is started and cancelled at once (seen under a busy suite: FAILED).
    assert wait_until(lambda: not _node_completing(slurm_node), timeout=30)

    resumed = executor.apply(_directive("resume", job, directive_id=2), observed={})

    assert resumed is not None and resumed.outcome == "done", resumed
    # Without StartTime=now Slurm would hold a requeued job back for about two minutes.
    assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=60), {
        k: _job(job).get(k) for k in ("JobState", "Reason", "StartTime", "BeginTime", "Restarts")
    }
    assert wait_until(lambda: _lines(tmp_path / "starts") == ["start", "start"], timeout=10)
    assert _lines(tmp_path / "checkpoints") == ["checkpoint"]


def test_a_suspended_job_is_requeued_held_on_suspend_without_a_signal(
    slurm_node, slurm_cleanup, tmp_path
):
    # Slurm never answers a signal for a suspended job: it is requeued without one.
    job = _submit(script=_checkpointing(tmp_path))
    assert wait_until(lambda: _job(job).get("JobState") == "RUNNING", timeout=30), _job(job)
    executor = SlurmExecutor()
    paused = executor.apply(_directive("pause", job, directive_id=1), observed={})
    assert paused is not None and paused.outcome == "done", paused
    assert wait_until(lambda: _job(job).get("JobState") == "SUSPENDED", timeout=10), _job(job)

    started = time.monotonic()
    applied = executor.apply(_directive("suspend", job, directive_id=2), observed={})
    assert time.monotonic() - started < 5, applied
    assert applied is None, applied
    result = _outcome(executor, timeout=KILL_WAIT + 10)

    assert result is not None, _job(job)
    assert (result.outcome, result.detail) == (
        "done",
        f"job {job} requeued and held at once (SUSPENDED: Slurm cannot signal it)",
    )
    held = _job(job)
    assert (held["JobState"], held["Reason"]) == ("PENDING", "job_requeued_in_held_state")
    assert _lines(tmp_path / "checkpoints") == []
