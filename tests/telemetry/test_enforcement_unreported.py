"""Work beyond the processes an agent lists one by one on a GPU (docs/telemetry-protocol.md,
"unreported"): enforcement pauses it as a whole, with a pause of pid 0 on that GPU."""

from __future__ import annotations

import pytest
from django.utils import timezone

from telemetry.api.views import directive_to_wire
from telemetry.errors import TelemetryError
from telemetry.models import EnforcementAction, ProcessObservation
from telemetry.payload.reports import MAX_PROCESSES_PER_SAMPLE
from telemetry.services import enforce, node_register, samples_ingest
from tests.telemetry.batches import batch, gpu_uuid, process

pytestmark = pytest.mark.django_db

A = EnforcementAction.Action


@pytest.fixture
def node(tier):
    node, _ = node_register(name="n1", tier=tier, actor="test")
    return node


def decoys(count: int) -> list[dict]:
    return [process(1000 + i) for i in range(count)]


def report_with_unreported(node, *, running: int, count: int = 1) -> None:
    payload = batch(gpus=2, processes={0: decoys(MAX_PROCESSES_PER_SAMPLE)})
    payload["samples"][0]["unreported"] = {"count": count, "memory_mib": 8192, "running": running}
    samples_ingest(node=node, payload=payload)


def test_running_work_beyond_the_listed_processes_is_paused_on_its_gpu(node):
    report_with_unreported(node, running=1)

    issued = enforce(now=timezone.now()).issued

    [sweep] = [a for a in issued if a.pid == 0]
    assert sweep.action == A.PAUSE and sweep.gpu.uuid == gpu_uuid("n1", 0)
    assert "beyond the" in sweep.reason
    wire = directive_to_wire(sweep)
    assert (wire["action"], wire["pid"], wire["gpu"]) == ("pause", 0, gpu_uuid("n1", 0))
    # The listed decoys are paused one by one as before.
    assert len([a for a in issued if a.pid != 0]) == MAX_PROCESSES_PER_SAMPLE


def test_unreported_work_that_is_all_covered_or_stopped_gets_no_sweep(node):
    report_with_unreported(node, running=0, count=5)

    issued = enforce(now=timezone.now()).issued

    assert [a for a in issued if a.pid == 0] == []
    assert ProcessObservation.objects.get(pid=0).state == "stopped"


def test_a_sweep_is_issued_again_when_new_unreported_work_runs(node):
    report_with_unreported(node, running=1)
    [sweep] = [a for a in enforce(now=timezone.now()).issued if a.pid == 0]
    payload = batch(gpus=2, processes={0: decoys(MAX_PROCESSES_PER_SAMPLE)})
    payload["directive_results"] = [{"id": sweep.pk, "outcome": "done", "detail": "paused 1"}]
    payload["samples"][0]["unreported"] = {"count": 1, "memory_mib": 8192, "running": 0}
    samples_ingest(node=node, payload=payload)
    assert [a for a in enforce(now=timezone.now()).issued if a.pid == 0] == []

    report_with_unreported(node, running=2, count=2)

    assert [a.pid for a in enforce(now=timezone.now()).issued if a.pid == 0] == [0]


def test_processes_past_the_servers_limit_are_kept_as_unreported_work(node):
    """An agent that lists more than the limit (one before 0.2) loses no process: the rest
    are counted as unreported work, and the running ones get the GPU swept."""
    hidden = process(9999, allocation=5, launch_token="x" * 64)
    payload = batch(gpus=2, processes={0: [*decoys(MAX_PROCESSES_PER_SAMPLE), hidden]})

    result = samples_ingest(node=node, payload=payload)

    aggregate = ProcessObservation.objects.get(pid=0)
    assert (aggregate.state, aggregate.memory_mib) == ("running", 2048)
    assert result.refused
    assert [a.pid for a in enforce(now=timezone.now()).issued if a.pid == 0] == [0]


@pytest.mark.parametrize(
    "unreported",
    [
        {"count": 0, "memory_mib": 0, "running": 0},
        {"count": 2, "memory_mib": 10, "running": 3},
        {"count": 1, "memory_mib": -1, "running": 0},
        {"count": "1", "memory_mib": 10, "running": 0},
        [1, 2, 3],
    ],
)
def test_a_wrong_unreported_aggregate_refuses_the_batch(node, unreported):
    payload = batch(gpus=2, processes={0: [process(5)]})
    payload["samples"][0]["unreported"] = unreported
    with pytest.raises(TelemetryError) as refused:
        samples_ingest(node=node, payload=payload)
    assert any("unreported" in field for field in refused.value.errors)
