import random
import threading
import time
import uuid
from datetime import datetime

import pytest

from telemetry.agent.loop import AgentLoop, Backoff
from telemetry.agent.protocol import (
    AGENT_VERSION,
    DirectiveResult,
    GpuInfo,
    GpuSample,
    ProcessSample,
)
from telemetry.agent.signal_executor import SignalExecutor
from telemetry.agent.simulated_backend import SimulatedBackend, spawn_simulated_work
from telemetry.agent.transport import IngestClient

TOKEN = "node-token-123"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_loop(server_url: str, node: str, **overrides) -> AgentLoop:
    options = {
        "backend": SimulatedBackend(node, gpus=2),
        "executor": SignalExecutor(),
        "client": IngestClient(server=server_url, token=TOKEN, timeout_seconds=2.0),
        "hostname": node,
        "interval_seconds": 0.05,
        "backlog_limit": 1000,
        "backoff": Backoff(base_seconds=0.05, cap_seconds=0.2),
        "rng": random.Random(7),
    }
    options.update(overrides)
    return AgentLoop(**options)


def parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, text
    return moment


def processes_in(body):
    return [p for sample in body["samples"] for p in sample["processes"]]


def test_a_batch_arrives_in_the_documented_shape(ingest, sim_node, children):
    child = children.add(spawn_simulated_work(sim_node, 1, allocation=42, mem_mib=1024))
    time.sleep(0.1)
    loop = make_loop(ingest.url, sim_node)

    report = loop.tick()

    assert (report.delivered, report.backlog, report.unavailable) == (1, 0, False)
    [received] = ingest.received
    assert received.headers["Authorization"] == f"Bearer {TOKEN}"
    assert received.headers["Content-Type"] == "application/json"
    body = received.body
    assert set(body) == {
        "batch_id", "sent_at", "backend", "agent_version", "hostname", "gpus", "samples",
        "directive_results",
    }  # fmt: skip
    assert uuid.UUID(body["batch_id"]).version == 4
    parse_time(body["sent_at"])
    assert body["backend"] == "simulated"
    assert body["agent_version"] == AGENT_VERSION
    assert body["hostname"] == sim_node
    assert body["gpus"][1] == {
        "uuid": f"GPU-SIM-{sim_node}-1",
        "index": 1,
        "name": "Simulated GPU (simulated)",
        "memory_total_mib": 81920,
        # Two NVLink islands by default; on two GPUs each is alone (simulated topology).
        "nvlink_domain": "nvl1",
        "pcie_switch": "pcie1",
    }
    assert [s["gpu"] for s in body["samples"]] == [g["uuid"] for g in body["gpus"]]
    sample = body["samples"][1]
    assert set(sample) == {
        "gpu", "at", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w",
        "temperature_c", "energy_j", "processes", "health",
    }  # fmt: skip
    assert sample["health"] == {
        "xid": [], "ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 0,
        "throttle": [], "lost": False,
    }  # fmt: skip
    parse_time(sample["at"])
    assert isinstance(sample["utilization_pct"], int) and 0 <= sample["utilization_pct"] <= 100
    assert isinstance(sample["memory_used_mib"], int) and sample["memory_used_mib"] == 1024
    assert sample["power_w"] >= 0 and sample["energy_j"] >= 0
    assert sample["processes"] == [
        {
            "pid": child.pid,
            "memory_mib": 1024,
            "allocation": 42,
            "slurm_job": None,
            "pod": None,
            "state": "running",
            "launch_token": None,
        }
    ]
    assert body["directive_results"] == []


def test_directives_are_applied_once_and_their_outcomes_arrive_in_the_next_batch(
    ingest, sim_node, children, wait_until, process_state
):
    worker = children.add(spawn_simulated_work(sim_node, 0, allocation=42))
    exited = children.add(spawn_simulated_work(sim_node, 1, allocation=43))
    time.sleep(0.1)
    loop = make_loop(ingest.url, sim_node)
    gpu0 = f"GPU-SIM-{sim_node}-0"
    pause = {
        "id": 11, "action": "pause", "gpu": gpu0, "pid": worker.pid, "allocation": 42,
        "slurm_job": None, "pod": None, "namespace": None, "grace_seconds": 30,
        "reason": "GPU used beyond its allocation",
    }  # fmt: skip
    gone = dict(pause, id=12, gpu=f"GPU-SIM-{sim_node}-1", pid=exited.pid, allocation=43)
    loop.tick()  # reports both processes
    exited.kill()
    exited.wait(timeout=5)
    ingest.directives.append([pause, gone])
    loop.tick()  # gets both directives; one process has exited meanwhile

    assert wait_until(lambda: process_state(worker.pid) == "T")

    # The server keeps sending the pause until it has the outcome: it is not applied again.
    ingest.directives.append([pause])
    loop.tick()
    second = ingest.delivered[2]
    assert {(r["id"], r["outcome"]) for r in second["directive_results"]} == {
        (11, "done"),
        (12, "gone"),
    }
    [paused] = [p for p in processes_in(second) if p["pid"] == worker.pid]
    assert paused["state"] == "stopped"

    resume = dict(pause, id=13, action="resume")
    ingest.directives.append([resume, pause])  # a late repeat of 11 must not pause again
    loop.tick()
    assert wait_until(lambda: process_state(worker.pid) in ("R", "S"))
    time.sleep(0.2)
    assert process_state(worker.pid) in ("R", "S")
    loop.tick()
    last = ingest.delivered[4]
    # 11 is only reported again (outcomes are at-least-once), never applied again.
    assert [(r["id"], r["outcome"]) for r in last["directive_results"]] == [
        (13, "done"),
        (11, "done"),
    ]
    assert loop.stats.directives_applied == 3


def test_termination_outcome_is_reported_once_the_process_is_gone(
    ingest, sim_node, children, wait_until
):
    worker = children.add(spawn_simulated_work(sim_node, 0, allocation=42))
    time.sleep(0.1)
    loop = make_loop(ingest.url, sim_node)
    ingest.directives.append(
        [
            {
                "id": 21,
                "action": "terminate",
                "pid": worker.pid,
                "grace_seconds": 5,
                "reason": "window ended",
            }
        ]
    )
    loop.tick()
    worker.wait(timeout=5)  # ended by the SIGTERM (the worker may exit 0 on it)

    loop.tick()

    [result] = ingest.delivered[1]["directive_results"]
    assert result == {"id": 21, "outcome": "done", "detail": "exited after SIGTERM"}


def test_an_invalid_directive_is_reported_failed_not_applied(ingest, sim_node):
    loop = make_loop(ingest.url, sim_node)
    ingest.directives.append([{"id": 31, "action": "reboot"}, {"action": "pause"}])

    loop.tick()
    loop.tick()

    assert ingest.delivered[1]["directive_results"] == [
        {"id": 31, "outcome": "failed", "detail": "unknown action 'reboot'"}
    ]


def test_a_directive_for_another_nodes_gpu_fails(ingest, sim_node):
    loop = make_loop(ingest.url, sim_node)
    ingest.directives.append([{"id": 41, "action": "pause", "gpu": "GPU-elsewhere", "pid": 1}])

    loop.tick()
    loop.tick()

    [result] = ingest.delivered[1]["directive_results"]
    assert (result["id"], result["outcome"]) == (41, "failed")
    assert "not on this node" in result["detail"]


def test_refused_batches_are_dropped_not_retried(ingest, sim_node, caplog):
    clock = FakeClock()
    loop = make_loop(ingest.url, sim_node, clock=clock)
    ingest.status = 400

    report = loop.tick()

    assert (report.refused, report.backlog) == (1, 0)
    assert loop.stats.batches_refused == 1
    assert "server refused batch" in caplog.text
    assert "refused by the stand-in" in caplog.text
    refused_id = ingest.bodies[0]["batch_id"]

    ingest.status = 200
    clock.advance(1)
    loop.tick()

    assert [b["batch_id"] for b in ingest.bodies].count(refused_id) == 1
    assert len(ingest.delivered) == 1


def test_server_down_grows_a_bounded_backlog_then_delivers_it_in_order(ingest, sim_node):
    clock = FakeClock()
    loop = make_loop(ingest.url, sim_node, clock=clock, backlog_limit=5)
    ingest.status = 503
    built: list[str] = []

    for _ in range(8):
        loop.tick()
        built.append(loop.backlog[-1].batch_id)
        clock.advance(1)  # beyond the backoff cap: every iteration tries again

    assert [b.batch_id for b in loop.backlog] == built[3:]
    assert loop.stats.batches_dropped == 3
    assert loop.stats.samples_dropped == 3 * 2  # two GPUs per batch
    assert len(ingest.delivered) == 0

    ingest.status = 200
    loop.tick()  # its new batch pushes out one more old one, then all five go

    delivered = [body["batch_id"] for body in ingest.delivered]
    assert delivered == built[4:] + [delivered[-1]]
    assert len(set(delivered)) == 5
    assert loop.stats.batches_dropped == 4
    assert loop.backlog == ()
    sample_times = [parse_time(body["samples"][0]["at"]) for body in ingest.delivered]
    assert sample_times == sorted(sample_times)


def test_no_retry_before_the_backoff_expires(ingest, sim_node):
    clock = FakeClock()
    loop = make_loop(
        ingest.url, sim_node, clock=clock, backoff=Backoff(base_seconds=4, cap_seconds=60)
    )
    ingest.status = 503

    loop.tick()  # fails: next try in 2..4 s
    for _ in range(3):
        clock.advance(0.5)
        loop.tick()

    assert len(ingest.received) == 1
    assert len(loop.backlog) == 4

    clock.advance(3)
    loop.tick()
    assert len(ingest.received) == 2


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    backoff = Backoff(base_seconds=1, cap_seconds=30)
    rng = random.Random(1)

    for failures, ceiling in [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (50, 30), (5000, 30)]:
        delays = [backoff.delay(failures=failures, rng=rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), failures
        assert len(set(delays)) > 1  # jittered


def test_server_stopped_then_restarted_on_its_port_gets_the_backlog_in_order(
    ingest, sim_node, wait_until
):
    port = ingest.port
    ingest.stop()  # connection refused from now on
    loop = make_loop(f"http://127.0.0.1:{port}", sim_node)
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, kwargs={"stop": stop})
    runner.start()
    try:
        assert wait_until(lambda: len(loop.backlog) >= 5)
        ingest.start(port=port)
        assert wait_until(lambda: len(ingest.delivered) >= loop.stats.batches_built > 5)
    finally:
        stop.set()
        runner.join(timeout=5)

    assert not runner.is_alive()
    assert loop.stats.batches_dropped == 0
    built_order = [parse_time(body["samples"][0]["at"]) for body in ingest.delivered]
    assert built_order == sorted(built_order)
    assert len({body["batch_id"] for body in ingest.delivered}) == len(ingest.delivered)


def test_a_hanging_server_times_out_and_the_batch_is_kept(ingest, sim_node):
    ingest.delay_seconds = 2.0
    loop = make_loop(
        ingest.url,
        sim_node,
        client=IngestClient(server=ingest.url, token=TOKEN, timeout_seconds=0.2),
    )

    started = time.monotonic()
    report = loop.tick()

    assert time.monotonic() - started < 1.5
    assert report.unavailable
    assert len(loop.backlog) == 1


class FlakyBackend:
    name = "simulated"

    def __init__(self) -> None:
        self.calls = 0

    def gpus(self):
        return (
            GpuInfo(
                uuid="GPU-SIM-flaky-0",
                index=0,
                name="Simulated GPU (simulated)",
                memory_total_mib=1,
            ),
        )

    def sample(self):
        self.calls += 1
        if self.calls % 2:
            raise OSError("sensor read failed")
        return (
            GpuSample(
                gpu="GPU-SIM-flaky-0",
                at=datetime.now().astimezone(),
                utilization_pct=0,
                memory_used_mib=0,
                memory_total_mib=1,
                power_w=0.0,
                temperature_c=30.0,
                energy_j=0.0,
            ),
        )

    def close(self) -> None:
        pass


class ExplodingExecutor:
    name = "exploding"

    def apply(self, directive, *, observed):
        raise RuntimeError("boom")

    def poll(self):
        raise RuntimeError("poll boom")


def test_errors_in_an_iteration_are_logged_and_the_loop_goes_on(ingest, caplog):
    backend = FlakyBackend()
    loop = make_loop(ingest.url, "flaky", backend=backend, executor=ExplodingExecutor())
    ingest.directives.append([{"id": 51, "action": "pause", "pid": 1}])
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, kwargs={"stop": stop})
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(ingest.delivered) < 3:
            time.sleep(0.02)
    finally:
        stop.set()
        runner.join(timeout=5)

    assert backend.calls >= 5
    assert "sampling failed" in caplog.text
    assert "failed while polling" in caplog.text
    results = [r for body in ingest.delivered for r in body["directive_results"]]
    assert results == [
        {"id": 51, "outcome": "failed", "detail": "executor error: RuntimeError: boom"}
    ]


def test_outcomes_of_a_batch_dropped_from_a_full_backlog_ride_with_the_next(ingest, sim_node):
    clock = FakeClock()
    loop = make_loop(ingest.url, sim_node, clock=clock, backlog_limit=2)
    ingest.directives.append([{"id": 61, "action": "pause", "pid": 999_999_999}])
    loop.tick()  # delivered; the directive's outcome ("gone") is pending
    ingest.status = 503
    for _ in range(4):  # the batch carrying the outcome is built, then pushed out
        clock.advance(1)
        loop.tick()
    assert loop.stats.batches_dropped == 2

    ingest.status = 200
    clock.advance(1)
    loop.tick()

    results = [r["id"] for body in ingest.delivered for r in body["directive_results"]]
    assert results == [61]


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_retryable_statuses_keep_the_batch(ingest, sim_node, status):
    ingest.status = status
    loop = make_loop(ingest.url, sim_node)

    report = loop.tick()

    assert report.unavailable and len(loop.backlog) == 1 and loop.stats.batches_refused == 0


def test_a_duplicate_answer_counts_as_delivered(ingest, sim_node):
    loop = make_loop(ingest.url, sim_node)
    loop.tick()
    ingest.seen_batch_ids.clear()
    ingest.status = 503
    loop.tick()  # kept in the backlog
    ingest.seen_batch_ids.add(loop.backlog[0].batch_id)  # as if a timed-out post had landed
    ingest.status = 200
    time.sleep(0.3)

    loop.tick()

    assert loop.backlog == ()
    assert loop.stats.batches_delivered == 3


class CrowdedBackend:
    """One GPU with 256 decoys, each with a made-up token, and a hidden job: more processes
    than a sample lists."""

    name = "simulated"
    uuid = "GPU-SIM-crowded-0"

    def gpus(self):
        return (GpuInfo(uuid=self.uuid, index=0, name="Simulated GPU", memory_total_mib=81920),)

    def sample(self):
        decoys = [
            ProcessSample(10 + i, 1, None, None, None, "running", f"{i:064d}") for i in range(256)
        ]
        hidden = ProcessSample(9000, 1, None, None, None, "running", None)
        return (
            GpuSample(
                gpu=self.uuid,
                at=datetime.now().astimezone(),
                utilization_pct=100,
                memory_used_mib=257,
                memory_total_mib=81920,
                power_w=300.0,
                temperature_c=70.0,
                energy_j=1.0,
                processes=(*decoys, hidden),
            ),
        )

    def close(self) -> None:
        pass


class RecordingExecutor:
    name = "recording"

    def __init__(self) -> None:
        self.applied = []

    def apply(self, directive, *, observed):
        self.applied.append((directive.action, directive.pid, directive.pid in observed))
        return DirectiveResult(id=directive.id, outcome="done", detail=f"paused {directive.pid}")

    def poll(self):
        return []


def test_a_pause_of_pid_0_pauses_the_gpus_unreported_work_from_the_full_list(ingest):
    executor = RecordingExecutor()
    loop = make_loop(ingest.url, "crowded", backend=CrowdedBackend(), executor=executor)
    loop.tick()
    [sample] = ingest.delivered[0]["samples"]
    assert len(sample["processes"]) == 256
    assert sample["unreported"] == {"count": 1, "memory_mib": 1, "running": 1}

    sweep = {"id": 71, "action": "pause", "gpu": CrowdedBackend.uuid, "pid": 0}
    ingest.directives.append([sweep])
    loop.tick()
    loop.tick()

    assert executor.applied == [("pause", 9000, True)]
    [result] = ingest.delivered[2]["directive_results"]
    assert (result["id"], result["outcome"]) == (71, "done")
    assert "9000" in result["detail"]
