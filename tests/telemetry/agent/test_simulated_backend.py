import os
import signal
import time
from pathlib import Path

import pytest

import telemetry.agent
from telemetry.agent.backends import SimulatedBackend, spawn_simulated_work


def _process_on(backend: SimulatedBackend, pid: int):
    for sample in backend.sample():
        for process in sample.processes:
            if process.pid == pid:
                return sample, process
    return None, None


def test_gpus_are_labelled_simulated_with_deterministic_uuids(sim_node):
    backend = SimulatedBackend(sim_node, gpus=3)

    gpus = backend.gpus()

    assert backend.name == "simulated"
    assert [gpu.uuid for gpu in gpus] == [f"GPU-SIM-{sim_node}-{i}" for i in range(3)]
    assert all("simulated" in gpu.name.lower() for gpu in gpus)
    assert [gpu.index for gpu in gpus] == [0, 1, 2]


def test_idle_node_samples_every_gpu_at_zero(sim_node):
    backend = SimulatedBackend(sim_node, gpus=2)

    samples = backend.sample()

    assert [s.gpu for s in samples] == [g.uuid for g in backend.gpus()]
    assert all(s.utilization_pct == 0 and s.processes == () for s in samples)
    assert all(s.memory_used_mib == 0 and s.power_w > 0 for s in samples)
    assert all(s.at.tzinfo is not None for s in samples)


def test_tagged_child_shows_up_with_its_allocation_and_then_stops_when_paused(
    children, sim_node, wait_until
):
    backend = SimulatedBackend(sim_node, gpus=2)
    child = children.add(spawn_simulated_work(sim_node, 1, allocation=42, mem_mib=2048, duty=0.8))
    time.sleep(0.3)

    backend.sample()  # the baseline for the CPU-time delta
    time.sleep(0.4)
    sample, process = _process_on(backend, child.pid)

    assert sample is not None, "the tagged child was not found"
    assert sample.gpu == f"GPU-SIM-{sim_node}-1"
    assert process.allocation == 42
    assert process.state == "running"
    assert process.memory_mib == 2048
    assert sample.memory_used_mib == 2048
    assert sample.utilization_pct > 10
    busy_power = sample.power_w

    os.killpg(child.pid, signal.SIGSTOP)
    assert wait_until(lambda: _process_on(backend, child.pid)[1].state == "stopped")
    time.sleep(0.3)
    paused_sample, paused_process = _process_on(backend, child.pid)

    assert paused_process.state == "stopped"
    assert paused_sample.utilization_pct == 0
    assert paused_sample.power_w < busy_power
    # Paused work still holds its memory, as it would on a real GPU.
    assert paused_sample.memory_used_mib == 2048


def test_untagged_and_other_node_processes_are_not_reported(children, sim_node):
    backend = SimulatedBackend(sim_node, gpus=1)
    other = children.add(spawn_simulated_work(f"{sim_node}-other", 0, allocation=1))
    wrong_gpu = children.add(spawn_simulated_work(sim_node, 5, allocation=2))
    time.sleep(0.2)

    pids = {p.pid for s in backend.sample() for p in s.processes}

    assert other.pid not in pids
    assert wrong_gpu.pid not in pids


def test_energy_counter_only_grows(children, sim_node):
    ticks = iter(float(t) for t in range(100))
    backend = SimulatedBackend(sim_node, gpus=1, clock=lambda: next(ticks))

    readings = [backend.sample()[0].energy_j for _ in range(4)]

    assert readings[0] == 0.0
    assert readings == sorted(readings)
    # 60 W idle for one second per sample.
    assert readings[-1] == pytest.approx(180.0)


def test_spawned_work_exits_with_its_parent(sim_node, wait_until, process_state, children):
    # The parent is a short-lived python that spawns a worker and exits at once.
    parent = children.python(
        "import sys\n"
        "from telemetry.agent.simulated_backend import spawn_simulated_work\n"
        f"worker = spawn_simulated_work({sim_node!r}, 0)\n"
        "print(worker.pid, flush=True)\n",
        env={"PYTHONPATH": str(Path(telemetry.agent.__file__).parents[2])},
    )
    worker_pid = int(parent.stdout.readline())
    parent.wait(timeout=5)

    assert wait_until(lambda: process_state(worker_pid) in (None, "Z"), timeout=5)


def test_a_jobs_launch_path_is_reported_with_the_token_of_the_work_it_launched(children, sim_node):
    """`srun gpumarket run ...` in a batch script: the batch shell and srun carry the job's
    environment but no launch token; they are the job's own, not untokened GPU work."""
    job = {"SLURM_JOB_ID": "4242"}
    token = "a" * 64
    shell = children.add(spawn_simulated_work(sim_node, 0, extra_env=job))
    srun = children.add(spawn_simulated_work(sim_node, 0, allocation=42, extra_env=job))
    work = children.add(
        spawn_simulated_work(
            sim_node, 0, allocation=42, extra_env={**job, "GPUMARKET_LAUNCH_TOKEN": token}
        )
    )
    other_job = children.add(spawn_simulated_work(sim_node, 0, extra_env={"SLURM_JOB_ID": "7"}))
    other_claim = children.add(spawn_simulated_work(sim_node, 0, allocation=9, extra_env=job))
    time.sleep(0.3)

    [sample] = SimulatedBackend(sim_node, gpus=1).sample()
    seen = {p.pid: (p.allocation, p.launch_token) for p in sample.processes}

    assert seen[work.pid] == (42, token)
    assert seen[shell.pid] == (42, token)
    assert seen[srun.pid] == (42, token)
    assert seen[other_job.pid] == (None, None)  # another job's: still untokened
    assert seen[other_claim.pid] == (9, None)  # claims another allocation: not the job's path
