import pytest

from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, ObservedProcess, ProcessSample
from telemetry.agent.slurm_executor import SlurmExecutor


def directive(action, *, slurm_job=None, pid=None, directive_id=1):
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
    )


@pytest.mark.parametrize(
    ("action", "verb"), [("pause", "suspend"), ("resume", "resume"), ("terminate", "requeue")]
)
def test_each_action_runs_its_scontrol_command(scontrol, action, verb):
    result = SlurmExecutor().apply(directive(action, slurm_job="1234"), observed={})

    assert result.outcome == "done"
    assert result.detail == f"scontrol {verb} 1234"
    assert scontrol() == [[verb, "1234"]]


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
    # (scontrol is looked up before anything else, so stand one in.)
    result = SlurmExecutor(scontrol="true").apply(directive("pause"), observed={})

    assert result.outcome == "failed"
    assert "no Slurm job" in result.detail


def test_without_scontrol_on_path_the_executor_cannot_start(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(ExecutorUnavailable, match="'scontrol' is not on PATH"):
        SlurmExecutor()
