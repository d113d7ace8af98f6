import os
import signal
from pathlib import Path

import pytest

from telemetry.agent.procmap import environ_read, pod_find, process_describe, slurm_job_find

SLEEPER = "import time\nwhile True: time.sleep(0.05)"


def test_process_describe_maps_a_real_child_by_its_environment(children, wait_until):
    child = children.python(
        SLEEPER,
        env={"GPUMARKET_ALLOCATION": "42", "SLURM_JOB_ID": "9001", "POD_NAME": "train-abcde"},
    )

    info = process_describe(child.pid)

    assert info is not None
    assert info.pid == child.pid
    assert info.allocation == 42
    assert info.slurm_job == "9001"
    assert info.pod == "train-abcde"
    assert info.state == "running"
    # start_new_session makes the child lead its own group.
    assert info.pgrp == child.pid


def test_process_describe_reports_a_stopped_child_as_stopped(children, wait_until):
    child = children.python(SLEEPER, env={"GPUMARKET_ALLOCATION": "7"})
    os.kill(child.pid, signal.SIGSTOP)

    assert wait_until(lambda: process_describe(child.pid).state == "stopped")

    os.kill(child.pid, signal.SIGCONT)
    assert wait_until(lambda: process_describe(child.pid).state == "running")


@pytest.mark.parametrize("value", ["not-a-number", "0", "-3", str(2**63)])
def test_process_describe_leaves_untagged_work_unmapped(children, value):
    # Out of the server's range the batch would be refused whole, so it is never sent.
    child = children.python(SLEEPER, env={"GPUMARKET_ALLOCATION": value})

    info = process_describe(child.pid)

    assert info is not None
    assert info.allocation is None


def test_process_describe_returns_none_for_an_exited_process(children):
    child = children.python("pass")
    child.wait(timeout=5)

    assert process_describe(child.pid) is None
    assert environ_read(child.pid) is None


def test_process_describe_returns_none_for_an_unreaped_zombie(children, wait_until, process_state):
    child = children.python("pass")

    assert wait_until(lambda: process_state(child.pid) == "Z")
    assert process_describe(child.pid) is None


def test_unreadable_environ_reads_as_empty_and_the_process_stays_reported(children, monkeypatch):
    # A non-root agent cannot read another user's environ; the process is still reported,
    # only unmapped. (Root reads through mode bits, so the refusal is stood in here.)
    child = children.python(SLEEPER, env={"GPUMARKET_ALLOCATION": "42"})
    real_read_bytes = Path.read_bytes

    def refuse_environ(path: Path) -> bytes:
        if path.name == "environ":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refuse_environ)

    assert environ_read(child.pid) == {}
    info = process_describe(child.pid)
    assert info is not None
    assert info.allocation is None
    assert info.state == "running"


def test_slurm_job_comes_from_the_cgroup_when_the_environment_has_none():
    cgroup_v2 = "0::/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0\n"
    cgroup_v1 = "4:memory:/slurm/uid_1000/job_555/step_batch/task_0\n"

    assert slurm_job_find({}, cgroup_v2) == "31337"
    assert slurm_job_find({}, cgroup_v1) == "555"
    assert slurm_job_find({"SLURM_JOB_ID": "1"}, cgroup_v2) == "1"
    assert slurm_job_find({}, "0::/user.slice/job_name_is_not_a_job\n") is None


def test_pod_comes_from_pod_name_else_the_cgroup_pod_uid():
    uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    cgroupfs = f"0::/kubepods/burstable/pod{uid}/abcdef\n"
    systemd = f"0::/kubepods.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-x\n"

    assert pod_find({}, cgroupfs) == uid
    assert pod_find({}, systemd) == uid
    assert pod_find({"POD_NAME": "trainer-0"}, cgroupfs) == "trainer-0"
    assert pod_find({}, "0::/\n") is None


def test_a_claim_the_server_would_refuse_falls_back_to_the_cgroup():
    cgroup = "0::/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0\n"
    uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"

    assert slurm_job_find({"SLURM_JOB_ID": "9" * 100}, cgroup) == "31337"
    assert slurm_job_find({"SLURM_JOB_ID": "9" * 100}, "0::/\n") is None
    assert slurm_job_find({"SLURM_JOB_ID": "1\x002"}, "0::/\n") is None
    assert pod_find({"POD_NAME": "p" * 300}, f"0::/kubepods/pod{uid}/x\n") == uid
