from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telemetry.agent.protocol import (
    DEFAULT_CHECKPOINT_SIGNAL,
    DEFAULT_GRACE_SECONDS,
    Batch,
    DirectiveInvalid,
    GpuSample,
    directive_parse,
)


def test_full_directive_parses():
    directive = directive_parse(
        {
            "id": 3, "action": "terminate", "gpu": "GPU-1", "pid": 10, "allocation": 7,
            "slurm_job": 1234, "pod": "p-abcde", "namespace": "ns", "grace_seconds": 12,
            "reason": "window ended",
        }
    )  # fmt: skip

    assert directive.id == 3
    assert directive.action == "terminate"
    assert directive.slurm_job == "1234"  # numbers are accepted for Slurm job ids
    assert directive.grace_seconds == 12


def test_minimal_directive_gets_defaults():
    directive = directive_parse({"id": 1, "action": "pause"})

    assert directive.pid is None and directive.gpu is None
    assert directive.grace_seconds == DEFAULT_GRACE_SECONDS
    assert directive.reason == ""


@pytest.mark.parametrize(
    ("wire", "parsed"), [("USR1", "USR1"), ("SIGUSR2", "USR2"), ("sigterm", "TERM")]
)
def test_suspend_carries_its_checkpoint_signal(wire, parsed):
    directive = directive_parse(
        {"id": 5, "action": "suspend", "slurm_job": "77", "checkpoint_signal": wire}
    )

    assert directive.action == "suspend"
    assert directive.checkpoint_signal == parsed


def test_checkpoint_signal_defaults_to_usr1():
    assert directive_parse({"id": 5, "action": "suspend"}).checkpoint_signal == "USR1"
    assert DEFAULT_CHECKPOINT_SIGNAL == "USR1"


@pytest.mark.parametrize("wire", ["KILL", "SIGSTOP", "CONT", "USR3", 10, ["USR1"]])
def test_a_checkpoint_signal_that_is_unknown_or_cannot_be_trapped_is_refused(wire):
    with pytest.raises(DirectiveInvalid, match="checkpoint_signal") as raised:
        directive_parse({"id": 6, "action": "suspend", "checkpoint_signal": wire})

    assert raised.value.directive_id == 6


@pytest.mark.parametrize(
    ("raw", "directive_id"),
    [
        ("pause", None),
        ({"action": "pause"}, None),
        ({"id": True, "action": "pause"}, None),
        ({"id": 4, "action": "delete"}, 4),
        ({"id": 4, "action": "pause", "pid": "12"}, 4),
        ({"id": 4, "action": "pause", "gpu": 5.5}, 4),
    ],
)
def test_bad_directives_are_refused_with_their_id(raw, directive_id):
    with pytest.raises(DirectiveInvalid) as raised:
        directive_parse(raw)

    assert raised.value.directive_id == directive_id


def test_naive_timestamps_are_never_sent():
    sample = GpuSample(
        gpu="GPU-1",
        at=datetime(2025, 1, 1, 12, 0),
        utilization_pct=0,
        memory_used_mib=0,
        memory_total_mib=1,
        power_w=0.0,
        temperature_c=0.0,
        energy_j=0.0,
    )

    with pytest.raises(ValueError, match="timezone"):
        sample.to_wire()


@given(offset_minutes=st.integers(min_value=-12 * 60, max_value=14 * 60))
def test_sent_at_round_trips_with_any_timezone(offset_minutes):
    moment = datetime(2025, 6, 1, 8, 30, tzinfo=timezone(timedelta(minutes=offset_minutes)))
    batch = Batch(backend="simulated", hostname="n", gpus=(), samples=())

    wire = batch.to_wire(sent_at=moment)

    assert datetime.fromisoformat(wire["sent_at"]) == moment
    assert datetime.fromisoformat(wire["sent_at"]).astimezone(UTC) == moment.astimezone(UTC)


def test_every_batch_has_its_own_id():
    ids = {
        Batch(backend="simulated", hostname="n", gpus=(), samples=()).batch_id for _ in range(100)
    }

    assert len(ids) == 100


def test_claims_the_server_would_refuse_are_sent_as_null_and_processes_capped():
    from datetime import UTC, datetime

    from telemetry.agent.protocol import MAX_PROCESSES_PER_GPU, GpuSample, ProcessSample

    def proc(pid: int, **claims) -> ProcessSample:
        base = {"allocation": None, "slurm_job": None, "pod": None}
        return ProcessSample(pid=pid, memory_mib=1, state="running", **(base | claims))

    hostile = [
        proc(1, slurm_job="9" * 100),
        proc(2, pod="p" * 300),
        proc(3, slurm_job="12\x0034"),
        proc(4, slurm_job="4242", pod="train-0"),
    ]
    many = hostile + [proc(10 + i) for i in range(MAX_PROCESSES_PER_GPU)]
    sample = GpuSample(
        gpu="GPU-1",
        at=datetime.now(UTC),
        utilization_pct=1.0,
        memory_used_mib=1,
        memory_total_mib=10,
        power_w=1.0,
        temperature_c=30.0,
        energy_j=1.0,
        processes=tuple(many),
    )
    wire = sample.to_wire()["processes"]
    assert len(wire) == MAX_PROCESSES_PER_GPU
    assert [(p["slurm_job"], p["pod"]) for p in wire[:4]] == [
        (None, None),
        (None, None),
        (None, None),
        ("4242", "train-0"),
    ]


def test_resume_carries_the_slurm_reservation_it_runs_in():
    directive = directive_parse(
        {"id": 7, "action": "resume", "slurm_job": "77", "slurm_reservation": "gm-12"}
    )

    assert directive.slurm_reservation == "gm-12"
    assert directive_parse({"id": 8, "action": "resume"}).slurm_reservation is None


@pytest.mark.parametrize("wire", ["--help", "gm 12", "a=b", 12.5])
def test_a_slurm_reservation_that_is_not_a_slurm_name_is_refused(wire):
    with pytest.raises(DirectiveInvalid, match="slurm_reservation"):
        directive_parse({"id": 9, "action": "resume", "slurm_reservation": wire})


def _sample_of(processes) -> GpuSample:
    return GpuSample(
        gpu="GPU-1",
        at=datetime.now(UTC),
        utilization_pct=1,
        memory_used_mib=1,
        memory_total_mib=10,
        power_w=1.0,
        temperature_c=30.0,
        energy_j=1.0,
        processes=tuple(processes),
    )


def _process(pid: int, *, allocation=None, token=None, memory_mib=1, state="running"):
    from telemetry.agent.protocol import ProcessSample

    return ProcessSample(
        pid=pid,
        memory_mib=memory_mib,
        allocation=allocation,
        slurm_job=None,
        pod=None,
        state=state,
        launch_token=token,
    )


def test_processes_past_the_limit_are_sent_as_an_unreported_aggregate():
    """256 cheap decoys must not hide a 257th job: it is counted, and, as no running listed
    process shares its allocation and token, counted as running work to sweep."""
    from telemetry.agent.protocol import MAX_PROCESSES_PER_GPU

    decoys = [_process(10 + i, allocation=7, token="d" * 64) for i in range(256)]
    hidden = _process(9000, memory_mib=8192)

    wire = _sample_of([*decoys, hidden]).to_wire()

    assert len(wire["processes"]) == MAX_PROCESSES_PER_GPU
    # One process of every (allocation, token) is listed first: the big untagged one too.
    assert 9000 in [p["pid"] for p in wire["processes"]]
    assert wire["unreported"] == {"count": 1, "memory_mib": 1, "running": 0}


def test_unreported_processes_of_no_running_listed_work_count_as_running():
    """Decoys each with its own made-up token fill the list: the 257th shares no running
    listed process's allocation and token, so it counts as running and is the sweep's."""
    from telemetry.agent.protocol import sweep_targets

    decoys = [_process(10 + i, token=f"{i:064d}") for i in range(256)]
    stopped = _process(8000, allocation=7, token="t" * 64, state="stopped")
    hidden = _process(9000)

    sample = _sample_of([*decoys, stopped, hidden])
    wire = sample.to_wire()

    assert wire["unreported"] == {"count": 2, "memory_mib": 2, "running": 1}
    assert [p.pid for p in sweep_targets(sample.processes)] == [9000]


def test_a_gpu_within_the_limit_has_no_unreported_aggregate():
    wire = _sample_of([_process(1)]).to_wire()
    assert "unreported" not in wire
