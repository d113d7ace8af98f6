import os
import subprocess
import sys
import time

from telemetry.agent.procmap import process_describe, stat_read
from telemetry.agent.protocol import Directive, ObservedProcess, ProcessSample
from telemetry.agent.signal_executor import SignalExecutor

GPU = "GPU-test-0"
# A worker that burns CPU, with a helper child in the same process group (like a data
# loader); prints the helper's pid.
FAMILY = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(helper.pid, flush=True)
while True:
    pass
"""
STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
POLITE = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)"
# Busy, and notes each SIGUSR1 (its checkpoint) and SIGTERM it gets in the file $MARKER.
CHECKPOINTING = """
import os, signal
def note(name):
    def handler(signum, frame):
        with open(os.environ["MARKER"], "a") as marker:
            marker.write(name + "\\n")
    return handler
signal.signal(signal.SIGUSR1, note("checkpoint"))
signal.signal(signal.SIGTERM, note("term"))
print("ready", flush=True)
while True:
    sum(range(1000))
"""


def directive(action, *, pid=None, allocation=None, grace=30, directive_id=1, signal="USR1"):
    return Directive(
        id=directive_id,
        action=action,
        gpu=GPU,
        pid=pid,
        allocation=allocation,
        slurm_job=None,
        pod=None,
        namespace=None,
        grace_seconds=grace,
        reason="test",
        checkpoint_signal=signal,
    )


def observed(*pids, allocation=None):
    return {
        pid: ObservedProcess(
            gpu=GPU,
            process=ProcessSample(
                pid=pid,
                memory_mib=1,
                allocation=allocation,
                slurm_job=None,
                pod=None,
                state="running",
            ),
        )
        for pid in pids
    }


def cpu_seconds(pid):
    return process_describe(pid).cpu_seconds


def test_pause_stops_the_whole_group_and_resume_starts_it_again(
    children, wait_until, process_state
):
    worker = children.python(FAMILY)
    helper_pid = int(worker.stdout.readline())
    executor = SignalExecutor()

    paused = executor.apply(directive("pause", pid=worker.pid), observed=observed(worker.pid))

    assert paused.outcome == "done"
    assert f"process group {worker.pid}" in paused.detail
    assert wait_until(lambda: process_state(worker.pid) == "T")
    assert wait_until(lambda: process_state(helper_pid) == "T")
    frozen = cpu_seconds(worker.pid)
    time.sleep(0.3)
    assert cpu_seconds(worker.pid) == frozen

    resumed = executor.apply(
        directive("resume", pid=worker.pid, directive_id=2), observed=observed(worker.pid)
    )

    assert resumed.outcome == "done"
    assert wait_until(lambda: process_state(worker.pid) in ("R", "S"))
    assert wait_until(lambda: process_state(helper_pid) in ("R", "S"))
    assert wait_until(lambda: cpu_seconds(worker.pid) > frozen + 0.05)


def test_terminate_ends_a_process_that_honours_sigterm(children, wait_until):
    worker = children.python(POLITE)
    worker.stdout.readline()
    executor = SignalExecutor()

    assert (
        executor.apply(directive("terminate", pid=worker.pid), observed=observed(worker.pid))
        is None
    )

    assert worker.wait(timeout=5) == -15
    [result] = executor.poll()
    assert (result.id, result.outcome, result.detail) == (1, "done", "exited after SIGTERM")
    assert executor.poll() == []


def test_terminate_kills_after_the_grace_period_without_blocking(
    children, wait_until, process_state
):
    worker = children.python(STUBBORN)
    worker.stdout.readline()
    now = [1000.0]
    executor = SignalExecutor(clock=lambda: now[0])

    started = time.monotonic()
    assert (
        executor.apply(
            directive("terminate", pid=worker.pid, grace=30), observed=observed(worker.pid)
        )
        is None
    )
    assert time.monotonic() - started < 1.0  # the grace period is not slept through

    time.sleep(0.2)
    assert executor.poll() == []  # still in its grace period, ignoring SIGTERM
    assert process_state(worker.pid) in ("R", "S")

    now[0] += 30
    assert executor.poll() == []  # SIGKILL sent; the outcome comes with the next poll
    assert worker.wait(timeout=5) == -9
    [result] = executor.poll()
    assert result.outcome == "done"
    assert result.detail == "killed with SIGKILL after 30s grace"


def test_terminate_reaches_a_paused_process(children, wait_until, process_state):
    worker = children.python(POLITE)
    worker.stdout.readline()
    executor = SignalExecutor()
    executor.apply(directive("pause", pid=worker.pid), observed=observed(worker.pid))
    assert wait_until(lambda: process_state(worker.pid) == "T")

    executor.apply(
        directive("terminate", pid=worker.pid, directive_id=2), observed=observed(worker.pid)
    )

    assert worker.wait(timeout=5) == -15


def test_directive_for_an_exited_process_is_gone(children):
    worker = children.python("pass")
    worker.wait(timeout=5)
    executor = SignalExecutor()

    for action in ("pause", "resume", "terminate", "suspend"):
        seen = executor.apply(directive(action, pid=worker.pid), observed=observed(worker.pid))
        unseen = executor.apply(directive(action, pid=worker.pid), observed={})
        assert seen.outcome == "gone"
        assert unseen.outcome == "gone"


def test_a_live_process_the_agent_did_not_report_is_never_signalled(children, process_state):
    bystander = children.python(POLITE)
    bystander.stdout.readline()

    result = SignalExecutor().apply(directive("terminate", pid=bystander.pid), observed={})

    assert result.outcome == "failed"
    assert "not a GPU process this agent reported" in result.detail
    time.sleep(0.1)
    assert bystander.poll() is None


def test_allocation_directive_reaches_every_process_of_the_allocation(
    children, wait_until, process_state
):
    first = children.python(POLITE)
    second = children.python(POLITE)
    other = children.python(POLITE)
    for child in (first, second, other):
        child.stdout.readline()
    seen = {**observed(first.pid, second.pid, allocation=5), **observed(other.pid, allocation=6)}

    result = SignalExecutor().apply(directive("pause", allocation=5), observed=seen)

    assert result.outcome == "done"
    assert wait_until(lambda: process_state(first.pid) == "T")
    assert wait_until(lambda: process_state(second.pid) == "T")
    assert process_state(other.pid) in ("R", "S")


def test_allocation_with_nothing_running_here_is_gone():
    result = SignalExecutor().apply(directive("pause", allocation=99), observed={})

    assert result.outcome == "gone"


def test_work_in_the_agents_own_group_gets_the_signal_alone(children, wait_until, process_state):
    # A child that did not start a session of its own shares this process's group;
    # signalling that group would stop the agent too.
    child = subprocess.Popen([sys.executable, "-c", POLITE], stdout=subprocess.PIPE)
    children.add(child)
    child.stdout.readline()
    assert stat_read(child.pid).pgrp == os.getpgrp()

    result = SignalExecutor().apply(directive("pause", pid=child.pid), observed=observed(child.pid))

    assert result.detail == f"SIGSTOP sent to pid {child.pid}"
    assert wait_until(lambda: process_state(child.pid) == "T")
    assert process_state(os.getpid()) in ("R", "S")


def test_suspend_signals_a_checkpoint_then_stops_the_work_after_the_grace_until_resumed(
    children, wait_until, process_state, tmp_path
):
    marker = tmp_path / "marker"
    worker = children.python(CHECKPOINTING, env={"MARKER": str(marker)})
    worker.stdout.readline()
    now = [1000.0]
    executor = SignalExecutor(clock=lambda: now[0])

    applied = executor.apply(
        directive("suspend", pid=worker.pid, grace=30), observed=observed(worker.pid)
    )

    assert applied is None  # reported once the work is stopped
    assert wait_until(lambda: marker.exists() and marker.read_text() == "checkpoint\n")
    assert executor.poll() == []  # in its grace: still running
    assert process_state(worker.pid) in ("R", "S")
    now[0] += 30
    [result] = executor.poll()
    assert result.outcome == "done"
    assert result.detail == (
        f"process group {worker.pid} (pid {worker.pid}): SIGUSR1, then SIGSTOP after 30s grace"
    )
    assert wait_until(lambda: process_state(worker.pid) == "T")
    frozen = cpu_seconds(worker.pid)
    time.sleep(0.3)
    assert cpu_seconds(worker.pid) == frozen
    assert executor.poll() == []
    assert marker.read_text() == "checkpoint\n"  # never sent SIGTERM
    assert worker.poll() is None  # nor killed

    resumed = executor.apply(
        directive("resume", pid=worker.pid, directive_id=2), observed=observed(worker.pid)
    )

    assert resumed.outcome == "done"
    assert wait_until(lambda: cpu_seconds(worker.pid) > frozen + 0.05)
    assert marker.read_text() == "checkpoint\n"


def test_suspend_sends_the_signal_the_directive_names(children, wait_until, tmp_path):
    marker = tmp_path / "marker"
    worker = children.python(CHECKPOINTING, env={"MARKER": str(marker)})
    worker.stdout.readline()
    executor = SignalExecutor()

    executor.apply(
        directive("suspend", pid=worker.pid, signal="TERM"), observed=observed(worker.pid)
    )

    assert wait_until(lambda: marker.exists() and marker.read_text() == "term\n")


def test_suspending_a_paused_group_sends_no_signal_and_reports_at_once(
    children, wait_until, process_state, tmp_path
):
    marker = tmp_path / "marker"
    worker = children.python(CHECKPOINTING, env={"MARKER": str(marker)})
    worker.stdout.readline()
    executor = SignalExecutor()
    executor.apply(directive("pause", pid=worker.pid), observed=observed(worker.pid))
    assert wait_until(lambda: process_state(worker.pid) == "T")

    result = executor.apply(
        directive("suspend", pid=worker.pid, directive_id=2), observed=observed(worker.pid)
    )

    assert result.outcome == "done"
    assert (
        result.detail
        == f"process group {worker.pid} (pid {worker.pid}) already stopped; no SIGUSR1"
    )
    executor.apply(
        directive("resume", pid=worker.pid, directive_id=3), observed=observed(worker.pid)
    )
    assert wait_until(lambda: process_state(worker.pid) in ("R", "S"))
    time.sleep(0.2)  # a signal held while stopped would be handled by now
    assert not marker.exists()


def test_work_that_exits_on_the_checkpoint_signal_is_gone(children):
    worker = children.python(POLITE)  # SIGUSR1's default action ends it
    worker.stdout.readline()
    executor = SignalExecutor()

    assert (
        executor.apply(directive("suspend", pid=worker.pid), observed=observed(worker.pid)) is None
    )

    assert worker.wait(timeout=5) == -10
    [result] = executor.poll()
    assert result.outcome == "gone"
    assert result.detail == f"process group {worker.pid} (pid {worker.pid}) exited after SIGUSR1"


def test_resume_within_the_grace_means_the_work_is_never_stopped(
    children, wait_until, process_state, tmp_path
):
    marker = tmp_path / "marker"
    worker = children.python(CHECKPOINTING, env={"MARKER": str(marker)})
    worker.stdout.readline()
    now = [0.0]
    executor = SignalExecutor(clock=lambda: now[0])
    executor.apply(directive("suspend", pid=worker.pid, grace=30), observed=observed(worker.pid))

    executor.apply(
        directive("resume", pid=worker.pid, directive_id=2), observed=observed(worker.pid)
    )
    [result] = executor.poll()

    assert (result.id, result.outcome) == (1, "done")
    assert "not stopped, directive 2 (resume) came within the grace" in result.detail
    now[0] += 60
    assert executor.poll() == []
    time.sleep(0.2)
    assert process_state(worker.pid) in ("R", "S")
