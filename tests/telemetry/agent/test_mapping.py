"""Work without GPUMARKET_ALLOCATION is mapped through its Slurm job's comment or its pod's
label; the processes are real children, scontrol and the Kubernetes API are stand-ins."""

import dataclasses
import logging
import random
import time

import pytest

from telemetry.agent import main
from telemetry.agent.errors import MappingUnavailable
from telemetry.agent.kubernetes_mapping import KubernetesAllocations
from telemetry.agent.lookup import Lookup, LookupCache
from telemetry.agent.loop import AgentLoop, Backoff
from telemetry.agent.mapping import AllocationMapper, mapper_build
from telemetry.agent.procmap import process_describe
from telemetry.agent.signal_executor import SignalExecutor
from telemetry.agent.simulated_backend import SimulatedBackend, spawn_simulated_work
from telemetry.agent.slurm_mapping import SlurmAllocations
from telemetry.agent.transport import IngestClient

SLEEPER = "import time\nwhile True: time.sleep(0.05)"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mapped(source, child) -> int | None:
    info = process_describe(child.pid)
    assert info is not None
    return AllocationMapper(sources=(source,)).apply(info).allocation


def show_calls(scontrol) -> list[list[str]]:
    return [call for call in scontrol() if call[:2] == ["show", "job"]]


def loop_for(ingest, node, mapper) -> AgentLoop:
    return AgentLoop(
        backend=SimulatedBackend(node, gpus=1, mapper=mapper),
        executor=SignalExecutor(),
        client=IngestClient(server=ingest.url, token="t", timeout_seconds=2.0),
        hostname=node,
        interval_seconds=0.05,
        backoff=Backoff(base_seconds=0.05, cap_seconds=0.2),
        rng=random.Random(7),
    )


def reported(body, pid):
    [process] = [p for s in body["samples"] for p in s["processes"] if p["pid"] == pid]
    return process


def test_the_cache_is_bounded_and_drops_expired_answers_first():
    clock = FakeClock()
    cache = LookupCache(found_ttl_seconds=10, failed_ttl_seconds=1, limit=3, clock=clock)
    cache.get("failed", lambda: Lookup(allocation=None, settled=False))
    cache.get("a", lambda: Lookup(allocation=1, settled=True))
    cache.get("b", lambda: Lookup(allocation=2, settled=True))
    clock.now += 2  # "failed" has expired, "a" and "b" have not

    cache.get("c", lambda: Lookup(allocation=3, settled=True))
    assert len(cache) == 3
    assert cache.get("a", lambda: Lookup(allocation=99, settled=True)) == 1

    cache.get("d", lambda: Lookup(allocation=4, settled=True))  # all live: the oldest goes
    assert len(cache) == 3
    assert cache.get("a", lambda: Lookup(allocation=99, settled=True)) == 99


# Slurm


def test_a_slurm_job_is_mapped_through_its_comment(ingest, sim_node, children, scontrol):
    scontrol.job("5150", comment="gpumarket:allocation=42")
    worker = children.add(spawn_simulated_work(sim_node, 0, extra_env={"SLURM_JOB_ID": "5150"}))
    loop = loop_for(ingest, sim_node, AllocationMapper(sources=(SlurmAllocations(),)))

    loop.tick()

    [body] = ingest.delivered
    process = reported(body, worker.pid)
    assert (process["allocation"], process["slurm_job"]) == (42, "5150")
    assert show_calls(scontrol) == [["show", "job", "5150", "--oneliner"]]


@pytest.mark.parametrize(
    ("comment", "allocation"),
    [
        ("(null)", None),  # no comment: the record's AdminComment tag is not the job's
        ("site:project=vision,gpumarket:allocation=7", 7),
        ("gpumarket:allocation=seven", None),
        ("gpumarket:allocation=0", None),  # the server would refuse the whole batch
    ],
)
def test_only_the_comments_tag_maps_a_job(scontrol, children, comment, allocation):
    scontrol.job("31", comment=comment)
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "31"})

    assert mapped(SlurmAllocations(), child) == allocation


def test_a_non_integer_comment_is_ignored_with_a_warning(scontrol, children, caplog):
    scontrol.job("32", comment="gpumarket:allocation=seven")
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "32"})

    with caplog.at_level(logging.WARNING):
        assert mapped(SlurmAllocations(), child) is None

    assert "Slurm job 32 names allocation 'seven', which is not an allocation id" in caplog.text


def test_a_failing_scontrol_leaves_the_work_untagged_and_the_loop_goes_on(
    ingest, sim_node, children, scontrol, caplog
):
    # Job 500: the stand-in cannot reach the controller; job 77: a job it does not know.
    unreachable = children.add(spawn_simulated_work(sim_node, 0, extra_env={"SLURM_JOB_ID": "500"}))
    unknown = children.add(spawn_simulated_work(sim_node, 0, extra_env={"SLURM_JOB_ID": "77"}))
    loop = loop_for(ingest, sim_node, AllocationMapper(sources=(SlurmAllocations(),)))

    first = loop.tick()
    second = loop.tick()

    assert (first.delivered, second.delivered) == (1, 1)
    for body in ingest.delivered:
        assert reported(body, unreachable.pid)["allocation"] is None
        assert reported(body, unknown.pid)["allocation"] is None
        assert reported(body, unknown.pid)["slurm_job"] == "77"
    assert "Unable to contact slurm controller" in caplog.text
    # Failures are cached too: the second iteration did not ask again.
    assert len(show_calls(scontrol)) == 2


def test_a_hung_scontrol_is_cut_off(scontrol, children, tmp_path):
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nsleep 5\n")
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "1"})

    assert mapped(SlurmAllocations(timeout_seconds=0.3), child) is None


def test_answers_are_cached_per_job_until_they_expire(scontrol, children):
    scontrol.job("5150", comment="gpumarket:allocation=42")
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "5150"})
    clock = FakeClock()
    source = SlurmAllocations(found_ttl_seconds=300, failed_ttl_seconds=30, clock=clock)

    assert mapped(source, child) == 42
    scontrol.job("5150", comment="gpumarket:allocation=43")
    clock.now += 299
    assert mapped(source, child) == 42
    assert len(show_calls(scontrol)) == 1

    clock.now += 2
    assert mapped(source, child) == 43
    assert len(show_calls(scontrol)) == 2


def test_a_failed_lookup_is_retried_after_the_short_ttl(scontrol, children):
    # Submitted a moment ago: the controller does not know the job yet.
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "88"})
    clock = FakeClock()
    source = SlurmAllocations(found_ttl_seconds=300, failed_ttl_seconds=30, clock=clock)

    assert mapped(source, child) is None
    scontrol.job("88", comment="gpumarket:allocation=5")
    clock.now += 29
    assert mapped(source, child) is None
    clock.now += 2
    assert mapped(source, child) == 5
    assert len(show_calls(scontrol)) == 2


def test_something_that_is_not_a_job_id_never_reaches_the_command_line(scontrol, children):
    child = children.python(SLEEPER, env={"SLURM_JOB_ID": "--all"})

    assert mapped(SlurmAllocations(), child) is None
    assert scontrol() == []


def test_without_scontrol_on_path_slurm_mapping_cannot_start(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(MappingUnavailable, match="'scontrol' is not on PATH"):
        mapper_build(names=["slurm"])
    argv = ["--server", "http://127.0.0.1:1", "--token", "t", "--backend", "simulated"]
    assert main([*argv, "--map", "slurm"]) == 3
    assert "mapping Slurm jobs needs Slurm's client tools" in caplog.text


# Kubernetes


def test_a_pod_is_mapped_through_its_label(api, children):
    api.pod_labelled("research", "train-7-x2x9q", {"gpumarket.io/allocation": "42"})
    child = children.python(SLEEPER, env={"POD_NAME": "train-7-x2x9q", "POD_NAMESPACE": "research"})

    assert mapped(KubernetesAllocations(api_client=api.client()), child) == 42
    assert api.reads == ["/api/v1/namespaces/research/pods/train-7-x2x9q"]


def test_a_pod_is_mapped_in_the_loop(api, ingest, sim_node, children):
    api.pod_labelled("default", "infer-0", {"gpumarket.io/allocation": "9"})
    worker = children.add(spawn_simulated_work(sim_node, 0, extra_env={"POD_NAME": "infer-0"}))
    source = KubernetesAllocations(api_client=api.client())
    loop = loop_for(ingest, sim_node, AllocationMapper(sources=(source,)))

    loop.tick()
    loop.tick()

    for body in ingest.delivered:
        assert reported(body, worker.pid)["allocation"] == 9
        assert reported(body, worker.pid)["pod"] == "infer-0"
    # Without POD_NAMESPACE the agent's default namespace; asked once, then cached.
    assert api.reads == ["/api/v1/namespaces/default/pods/infer-0"]


@pytest.mark.parametrize(
    "labels",
    [
        {},
        {"batch.kubernetes.io/job-name": "train-7"},
        {"gpumarket.io/allocation": "forty-two"},
        {"gpumarket.io/allocation": "-4"},
    ],
)
def test_a_pod_without_a_usable_label_stays_untagged(api, children, labels):
    api.pod_labelled("default", "bare", labels)
    child = children.python(SLEEPER, env={"POD_NAME": "bare"})

    assert mapped(KubernetesAllocations(api_client=api.client()), child) is None


def test_a_missing_pod_is_asked_about_again_after_the_short_ttl(api, children):
    child = children.python(SLEEPER, env={"POD_NAME": "late"})
    clock = FakeClock()
    source = KubernetesAllocations(api_client=api.client(), failed_ttl_seconds=30, clock=clock)

    assert mapped(source, child) is None
    api.pod_labelled("default", "late", {"gpumarket.io/allocation": "3"})
    clock.now += 29
    assert mapped(source, child) is None
    clock.now += 2
    assert mapped(source, child) == 3
    assert len(api.reads) == 2


def test_an_unreachable_api_leaves_the_work_untagged(children, api):
    child = children.python(SLEEPER, env={"POD_NAME": "x"})
    unreachable = dataclasses.replace(api, url="http://127.0.0.1:9").client()
    source = KubernetesAllocations(api_client=unreachable, request_timeout_seconds=1)

    assert mapped(source, child) is None


def test_a_pod_known_only_by_its_cgroup_uid_is_not_looked_up(api, children, caplog):
    child = children.python(SLEEPER)
    uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    info = dataclasses.replace(process_describe(child.pid), pod=uid)

    with caplog.at_level(logging.INFO):
        result = AllocationMapper(sources=(KubernetesAllocations(api_client=api.client()),))
        assert result.apply(info).allocation is None

    assert api.reads == []
    assert "set POD_NAME through the downward API" in caplog.text


# Both, and the environment variable


def test_the_environment_variable_beats_the_job_comment_and_the_pod_label(api, scontrol, children):
    scontrol.job("5150", comment="gpumarket:allocation=42")
    api.pod_labelled("default", "p", {"gpumarket.io/allocation": "43"})
    tagged = children.python(
        SLEEPER, env={"GPUMARKET_ALLOCATION": "7", "SLURM_JOB_ID": "5150", "POD_NAME": "p"}
    )
    untagged = children.python(SLEEPER, env={"SLURM_JOB_ID": "404", "POD_NAME": "p"})
    mapper = AllocationMapper(
        sources=(SlurmAllocations(), KubernetesAllocations(api_client=api.client()))
    )

    assert mapper.apply(process_describe(tagged.pid)).allocation == 7
    assert scontrol() == [] and api.reads == []
    # No environment tag, no such job: the pod's label is next.
    assert mapper.apply(process_describe(untagged.pid)).allocation == 43


def test_the_command_line_maps_through_scontrol(ingest, sim_node, children, scontrol):
    scontrol.job("5150", comment="gpumarket:allocation=42")
    worker = children.add(spawn_simulated_work(sim_node, 0, extra_env={"SLURM_JOB_ID": "5150"}))
    time.sleep(0.05)
    argv = ["--server", ingest.url, "--token", "t", "--backend", "simulated", "--once"]

    # --executor slurm maps Slurm jobs by default; --map none turns it off.
    assert main([*argv, "--node-name", sim_node, "--executor", "slurm"]) == 0
    assert main([*argv, "--node-name", sim_node, "--executor", "slurm", "--map", "none"]) == 0
    assert main([*argv, "--node-name", sim_node, "--map", "slurm"]) == 0

    allocations = [reported(body, worker.pid)["allocation"] for body in ingest.delivered]
    assert allocations == [42, None, 42]
    assert main([*argv, "--map", "slurm,pbs"]) == 2
