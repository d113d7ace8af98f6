import pytest

from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, ObservedProcess, ProcessSample
from telemetry.agent.slurm_executor import SlurmExecutor


def directive(action, *, slurm_job=None, pid=None, directive_id=1, signal="USR1", reservation=None):
    return Directive(
        id=directive_id,
        action=action,
        gpu="GPU-0",
        pid=pid,
        allocation=None,
        slurm_job=slurm_job,
        pod=None,
        namespace=None,
        grace_seconds=30,
        reason="test",
        checkpoint_signal=signal,
        slurm_reservation=reservation,
    )


def test_pause_suspends_the_job(scontrol):
    result = SlurmExecutor().apply(directive("pause", slurm_job="1234"), observed={})

    assert result.outcome == "done"
    assert result.detail == "scontrol suspend 1234"
    assert scontrol() == [["suspend", "1234"]]


def test_resume_resumes_a_suspended_job(scontrol):
    scontrol.job("1234", state="SUSPENDED")

    result = SlurmExecutor().apply(directive("resume", slurm_job="1234"), observed={})

    assert (result.outcome, result.detail) == ("done", "scontrol resume 1234")
    assert scontrol()[1:] == [["resume", "1234"]]


def test_resume_releases_a_requeued_job_and_lets_it_start_now(scontrol):
    # Slurm makes a requeued job wait about two minutes after its release otherwise.
    scontrol.job("1234", state="PENDING", reason="job_requeued_in_held_state")

    result = SlurmExecutor().apply(directive("resume", slurm_job="1234"), observed={})

    assert result.outcome == "done"
    assert result.detail == "scontrol release 1234 (requeued; StartTime=now)"
    assert scontrol()[1:] == [["release", "1234"], ["update", "JobId=1234", "StartTime=now"]]


def test_resume_moves_a_requeued_job_into_its_orders_new_reservation_first(scontrol):
    scontrol.job("1234", state="PENDING", reason="job_requeued_in_held_state")

    result = SlurmExecutor().apply(
        directive("resume", slurm_job="1234", reservation="gm-12"), observed={}
    )

    assert result.outcome == "done"
    assert result.detail == (
        "scontrol release 1234 (requeued; StartTime=now) into reservation gm-12"
    )
    assert scontrol()[1:] == [
        ["update", "JobId=1234", "ReservationName=gm-12"],
        ["release", "1234"],
        ["update", "JobId=1234", "StartTime=now"],
    ]


def test_resume_of_a_running_job_sets_no_reservation(scontrol):
    scontrol.job("1234")

    result = SlurmExecutor().apply(
        directive("resume", slurm_job="1234", reservation="gm-12"), observed={}
    )

    assert result.detail == "job 1234 is running; nothing to do"
    assert scontrol() == [["show", "job", "1234", "--oneliner"]]


def test_resume_releases_a_job_held_while_pending(scontrol):
    scontrol.job("1234", state="PENDING", reason="JobHeldAdmin")

    result = SlurmExecutor().apply(directive("resume", slurm_job="1234"), observed={})

    assert (result.outcome, result.detail) == ("done", "scontrol release 1234")
    assert scontrol()[1:] == [["release", "1234"]]


def test_resume_of_a_running_job_changes_nothing(scontrol):
    scontrol.job("1234")

    result = SlurmExecutor().apply(directive("resume", slurm_job="1234"), observed={})

    assert (result.outcome, result.detail) == ("done", "job 1234 is running; nothing to do")
    assert scontrol() == [["show", "job", "1234", "--oneliner"]]


def test_job_comes_from_the_observed_process_when_the_directive_has_none(scontrol):
    seen = {
        77: ObservedProcess(
            gpu="GPU-0",
            process=ProcessSample(
                pid=77, memory_mib=1, allocation=3, slurm_job="5150", pod=None, state="running"
            ),
        )
    }

    result = SlurmExecutor().apply(directive("pause", pid=77), observed=seen)

    assert result.outcome == "done"
    assert scontrol() == [["suspend", "5150"]]


def test_unknown_job_is_gone_and_a_refusal_fails_with_scontrols_message(scontrol):
    executor = SlurmExecutor()

    gone = executor.apply(directive("pause", slurm_job="404"), observed={})
    refused = executor.apply(directive("pause", slurm_job="500"), observed={})

    assert gone.outcome == "gone"
    assert refused.outcome == "failed"
    assert "Access/permission denied" in refused.detail
    assert "exited 1" in refused.detail


def test_a_hung_scontrol_is_cut_off(scontrol, tmp_path):
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nsleep 5\n")

    result = SlurmExecutor(timeout_seconds=0.3).apply(
        directive("pause", slurm_job="1"), observed={}
    )

    assert result.outcome == "failed"
    assert "no answer in 0.3s" in result.detail


def test_something_that_is_not_a_job_id_never_reaches_the_command_line(scontrol):
    result = SlurmExecutor().apply(directive("pause", slurm_job="--all"), observed={})

    assert result.outcome == "failed"
    assert scontrol() == []


def test_without_a_job_the_directive_fails():
    # (the tools are looked up before anything else, so stand them in.)
    result = SlurmExecutor(scontrol="true", scancel="true").apply(directive("pause"), observed={})

    assert result.outcome == "failed"
    assert "no Slurm job" in result.detail


def test_without_scontrol_on_path_the_executor_cannot_start(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(ExecutorUnavailable, match="'scontrol' is not on PATH"):
        SlurmExecutor()


def test_terminate_sends_sigterm_then_cancels_the_job_once_the_grace_is_over(scontrol):
    now = [0.0]
    scontrol.job("1234")
    executor = SlurmExecutor(clock=lambda: now[0])

    assert executor.apply(directive("terminate", slurm_job="1234"), observed={}) is None
    assert scontrol()[-1] == ["scancel", "--signal=TERM", "--full", "1234"]
    now[0] = 29.0
    assert executor.poll() == []  # still running, grace not over
    now[0] = 30.0
    (result,) = executor.poll()  # grace over: cancelled, and seen gone
    assert scontrol()[-3:] == [
        ["show", "job", "1234", "--oneliner"],
        ["scancel", "1234"],
        ["show", "job", "1234", "--oneliner"],
    ]
    assert result.outcome == "done" and result.detail == "job 1234 cancelled after 30s grace"
    assert executor.poll() == []


@pytest.mark.parametrize("state", ["SUSPENDED", "PENDING"])
def test_terminate_cancels_a_job_that_is_not_running_without_a_signal(scontrol, state):
    # Slurm never answers `scancel --signal` for such a job.
    scontrol.job("1234", state=state)
    executor = SlurmExecutor(clock=lambda: 0.0)

    assert executor.apply(directive("terminate", slurm_job="1234"), observed={}) is None

    assert [c for c in scontrol() if c[0] == "scancel"] == [["scancel", "1234"]]
    (result,) = executor.poll()
    assert result.outcome == "done"
    assert result.detail == f"job 1234 cancelled at once ({state}: Slurm cannot signal it)"


def test_a_job_that_ends_on_sigterm_is_not_cancelled_again(scontrol):
    scontrol.job("77")
    executor = SlurmExecutor(clock=lambda: 0.0)
    assert executor.apply(directive("terminate", slurm_job="77"), observed={}) is None
    scontrol.job("77", state="COMPLETED")
    (result,) = executor.poll()
    assert result.detail == "job 77 ended after SIGTERM"
    assert ["scancel", "77"] not in scontrol()


def test_terminating_a_job_slurm_no_longer_knows_is_gone(scontrol):
    result = SlurmExecutor().apply(directive("terminate", slurm_job="404"), observed={})
    assert result.outcome == "gone"


def test_terminating_a_job_that_has_ended_is_gone(scontrol):
    scontrol.job("1234", state="COMPLETED")

    result = SlurmExecutor().apply(directive("terminate", slurm_job="1234"), observed={})

    assert (result.outcome, result.detail) == ("gone", "job 1234 has ended (COMPLETED)")
    assert [c for c in scontrol() if c[0] == "scancel"] == []


def test_suspend_signals_a_running_job_then_requeues_and_holds_it_after_the_grace(scontrol):
    now = [0.0]
    scontrol.job("1234")
    executor = SlurmExecutor(clock=lambda: now[0])

    assert (
        executor.apply(directive("suspend", slurm_job="1234", signal="USR2"), observed={}) is None
    )
    assert scontrol()[-1] == ["scancel", "--signal=USR2", "--full", "1234"]
    now[0] = 29.0
    assert executor.poll() == []
    now[0] = 30.0
    (result,) = executor.poll()

    assert (result.outcome, result.detail) == ("done", "job 1234 requeued and held after 30s grace")
    assert ["requeuehold", "1234"] in scontrol()
    assert [c for c in scontrol() if c[0] == "scancel"] == [
        ["scancel", "--signal=USR2", "--full", "1234"]
    ]  # never cancelled
    assert executor.poll() == []


def test_suspend_requeues_a_suspended_job_at_once_without_a_signal(scontrol):
    scontrol.job("1234", state="SUSPENDED")
    executor = SlurmExecutor(clock=lambda: 0.0)

    assert executor.apply(directive("suspend", slurm_job="1234"), observed={}) is None
    (result,) = executor.poll()

    assert result.outcome == "done"
    assert result.detail == "job 1234 requeued and held at once (SUSPENDED: Slurm cannot signal it)"
    assert [c for c in scontrol() if c[0] != "show"] == [["requeuehold", "1234"]]


@pytest.mark.parametrize(
    ("reason", "detail", "commands"),
    [
        ("None", "scontrol hold 1234", [["hold", "1234"]]),
        ("JobHeldAdmin", "job 1234 is pending and held", []),
        ("job_requeued_in_held_state", "job 1234 is pending and held", []),
    ],
)
def test_suspend_holds_a_pending_job_at_once(scontrol, reason, detail, commands):
    scontrol.job("1234", state="PENDING", reason=reason)

    result = SlurmExecutor().apply(directive("suspend", slurm_job="1234"), observed={})

    assert (result.outcome, result.detail) == ("done", detail)
    assert [c for c in scontrol() if c[0] != "show"] == commands


def test_a_job_that_ends_on_its_checkpoint_signal_is_gone_and_not_requeued(scontrol):
    now = [0.0]
    scontrol.job("1234")
    executor = SlurmExecutor(clock=lambda: now[0])
    executor.apply(directive("suspend", slurm_job="1234"), observed={})
    scontrol.job("1234", state="COMPLETED")

    now[0] = 30.0
    (result,) = executor.poll()

    assert (result.outcome, result.detail) == ("gone", "job 1234 ended after SIGUSR1")
    assert ["requeuehold", "1234"] not in scontrol()


def test_resume_within_the_grace_means_the_job_is_never_requeued(scontrol):
    now = [0.0]
    scontrol.job("1234")
    executor = SlurmExecutor(clock=lambda: now[0])
    executor.apply(directive("suspend", slurm_job="1234"), observed={})

    resumed = executor.apply(directive("resume", slurm_job="1234", directive_id=2), observed={})
    (suspended,) = executor.poll()

    assert resumed.outcome == "done"
    assert (suspended.id, suspended.outcome) == (1, "done")
    assert suspended.detail == (
        "job 1234: SIGUSR1 sent, not requeued: directive 2 (resume) came first"
    )
    now[0] = 60.0
    assert executor.poll() == []
    assert ["requeuehold", "1234"] not in scontrol()


def test_a_job_that_may_not_be_requeued_fails_saying_why(scontrol):
    scontrol.job("1234", state="SUSPENDED", requeue=False)

    result = SlurmExecutor().apply(directive("suspend", slurm_job="1234"), observed={})

    assert result.outcome == "failed"
    assert "presently disabled" in result.detail and "--no-requeue" in result.detail
