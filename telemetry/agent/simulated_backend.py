"""A node of simulated GPUs whose work is made of real OS processes.

The GPUs are fake; the processes are not. A process belongs to simulated GPU `i` of node
`n` when its environment carries GPUMARKET_SIM_NODE=n and GPUMARKET_SIM_GPU=i (or i is in
its CUDA_VISIBLE_DEVICES, as `gpumarket run` sets it), and its
"GPU utilisation" is the CPU it burnt since the previous sample. So when an executor stops
a process with SIGSTOP, its utilisation really drops to zero, and the demo's charts show
enforcement happening rather than a scripted curve.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from telemetry.agent.energy import EnergyMeter
from telemetry.agent.mapping import ENV_ONLY, AllocationMapper
from telemetry.agent.procmap import (
    ALLOCATION_ENV,
    CLOCK_TICKS_PER_SECOND,
    PROC,
    ProcessInfo,
    pids_list,
    process_describe,
    uptime_read,
)
from telemetry.agent.protocol import GpuHealth, GpuInfo, GpuSample, ProcessSample, utcnow
from telemetry.agent.topology import simulated_topology

logger = logging.getLogger(__name__)

SIM_NODE_ENV = "GPUMARKET_SIM_NODE"
SIM_GPU_ENV = "GPUMARKET_SIM_GPU"
SIM_MEM_ENV = "GPUMARKET_SIM_MEM_MIB"
SIM_DUTY_ENV = "GPUMARKET_SIM_DUTY"
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
# A JSON file {"<GPU index>": "<fault>"} the simulated backend reads before every sample, so
# a running demo node can be made to fail (docs/capacity.md "Failures").
SIM_FAULTS_ENV = "GPUMARKET_SIM_FAULTS"
# What a simulated GPU can be made to report: an XID error (once), an uncorrectable ECC
# error, thermal or power throttling, or lost from the bus; "clear" ends the sticky ones.
FAULTS = ("xid", "ecc", "thermal", "power", "lost", "clear")
SIMULATED_XID = 48  # a double-bit ECC error: fatal

DEFAULT_MEM_MIB = 4096
SIMULATED_GPU_NAME = "Simulated GPU (simulated)"

# The worker busies the CPU for `duty` of every 100 ms and sleeps the rest. It exits as
# soon as its parent is gone, so a crashed test or demo never leaves workers spinning.
_WORK_CODE = """
import os, signal, sys, time
duty = min(max(float(os.environ.get("GPUMARKET_SIM_DUTY", "0.5")), 0.0), 1.0)
log = os.environ.get("GPUMARKET_SIM_SIGNAL_LOG")
def note(signum, frame):
    # A training job checkpoints on the checkpoint signal and carries on; SIGTERM ends it.
    if log:
        with open(log, "a") as out:
            out.write(signal.Signals(signum).name + "\\n")
    if signum == signal.SIGTERM:
        sys.exit(0)
for name in ("SIGUSR1", "SIGUSR2", "SIGCONT", "SIGTERM"):
    signal.signal(getattr(signal, name), note)
parent = os.getppid()
period = 0.1
while os.getppid() == parent:
    busy_until = time.monotonic() + period * duty
    while time.monotonic() < busy_until:
        pass
    time.sleep(period * (1.0 - duty))
"""


_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def exit_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies (Linux).

    Simulated work and the demo's helpers must never outlive whoever started them, even when
    that parent is killed outright; a SIGSTOPped child cannot notice on its own, but SIGKILL
    reaches it. Returns None where the kernel has no such facility.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return arm


def spawn_simulated_work(
    node: str,
    gpu: int | None,
    *,
    allocation: int | None = None,
    mem_mib: int = DEFAULT_MEM_MIB,
    duty: float = 0.5,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a real, lightly busy process that the simulated backend of `node` sees on `gpu`
    (None: on the GPUs of CUDA_VISIBLE_DEVICES in ``extra_env``, as `gpumarket run` sets it).

    It runs in its own session (and so its own process group), like a batch job would, so
    the signal executor's group-wide signals reach it and never the caller.
    """
    env = dict(os.environ)
    env.update(
        {
            SIM_NODE_ENV: node,
            SIM_MEM_ENV: str(mem_mib),
            SIM_DUTY_ENV: str(duty),
        }
    )
    env.pop(SIM_GPU_ENV, None)
    if gpu is not None:
        env[SIM_GPU_ENV] = str(gpu)
    if allocation is not None:
        env[ALLOCATION_ENV] = str(allocation)
    if extra_env:
        env.update(extra_env)
    return subprocess.Popen(
        [sys.executable, "-c", _WORK_CODE],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=exit_with_parent(signal.SIGKILL),  # noqa: PLW1509 - async-signal-safe prctl only
    )


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        node_name: str,
        *,
        gpus: int = 4,
        nvlink_islands: int = 2,
        memory_total_mib: int = 81920,
        idle_power_w: float = 60.0,
        max_power_w: float = 400.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        proc: Path = PROC,
        mapper: AllocationMapper = ENV_ONLY,
        faults_path: Path | None = None,
    ) -> None:
        if gpus < 1:
            raise ValueError("a simulated node needs at least one GPU")
        env_faults = os.environ.get(SIM_FAULTS_ENV)
        self._faults_path = faults_path or (Path(env_faults) if env_faults else None)
        self._faults_read: dict[str, str] = {}
        # index -> health now: sticky faults stay until cleared; an XID is reported once.
        self._health: dict[int, GpuHealth] = {}
        self._node = node_name
        self._memory_total_mib = memory_total_mib
        self._idle_power_w = idle_power_w
        self._max_power_w = max_power_w
        self._clock = clock
        self._wall = wall
        self._proc = proc
        self._mapper = mapper
        topology = simulated_topology(gpus, nvlink_islands)
        self._gpus = tuple(
            GpuInfo(
                uuid=f"GPU-SIM-{node_name}-{index}",
                index=index,
                name=SIMULATED_GPU_NAME,
                memory_total_mib=memory_total_mib,
                nvlink_domain=topology[index][0],
                pcie_switch=topology[index][1],
            )
            for index in range(gpus)
        )
        self._meters = {gpu.uuid: EnergyMeter() for gpu in self._gpus}
        # GPU index -> the power limit set through power_cap_set, in watts: simulated power
        # never goes above it, as a real GPU's board clocks down to its limit.
        self.power_caps: dict[int, int] = {}
        # (pid, start time) -> (CPU seconds, monotonic time) at the previous sample; the
        # start time keeps a recycled pid from inheriting another process's history.
        self._cpu_seen: dict[tuple[int, int], tuple[float, float]] = {}

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def close(self) -> None:
        self._cpu_seen.clear()

    def power_cap_set(self, index: int, watts: int | None) -> None:
        """Record GPU ``index``'s power limit (None: back to no limit) and keep its simulated
        power at or below it from the next sample."""
        if not 0 <= index < len(self._gpus):
            raise ValueError(f"node {self._node} has no simulated GPU {index}")
        if watts is None:
            self.power_caps.pop(index, None)
        else:
            self.power_caps[index] = watts

    def fault_inject(self, index: int, kind: str) -> None:
        """Make simulated GPU ``index`` report ``kind`` (one of FAULTS) from its next sample."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULTS)}")
        if not 0 <= index < len(self._gpus):
            raise ValueError(f"node {self._node} has no simulated GPU {index}")
        health = self._health.get(index, GpuHealth())
        if kind == "clear":
            self._health.pop(index, None)
            return
        if kind == "xid":
            health = replace(health, xid=(*health.xid, SIMULATED_XID))
        elif kind == "ecc":
            health = replace(
                health,
                ecc_volatile_uncorrected=health.ecc_volatile_uncorrected + 1,
                ecc_aggregate_uncorrected=health.ecc_aggregate_uncorrected + 1,
            )
        elif kind == "lost":
            health = replace(health, lost=True)
        else:
            health = replace(health, throttle=tuple(sorted({*health.throttle, kind})))
        self._health[index] = health

    def _faults_load(self) -> None:
        """Apply the faults file's entries that changed since the previous sample."""
        if self._faults_path is None:
            return
        try:
            wanted = json.loads(self._faults_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("cannot read simulated faults from %s: %s", self._faults_path, exc)
            return
        if not isinstance(wanted, dict):
            return
        for key, kind in wanted.items():
            if self._faults_read.get(key) == kind:
                continue
            try:
                self.fault_inject(_index(str(key)), str(kind))
            except ValueError as exc:
                logger.warning("simulated fault %s=%r ignored: %s", key, kind, exc)
            self._faults_read[key] = kind

    def _health_take(self, index: int) -> GpuHealth:
        health = self._health.get(index, GpuHealth())
        if health.xid:
            self._health[index] = replace(health, xid=())
        return health

    def sample(self) -> tuple[GpuSample, ...]:
        self._faults_load()
        now = self._clock()
        at = self._wall()
        per_gpu: dict[int, list[tuple[ProcessSample, float]]] = {g.index: [] for g in self._gpus}
        cpu_seen: dict[tuple[int, int], tuple[float, float]] = {}
        for info, indices in self._tagged_processes():
            key = (info.pid, info.start_ticks)
            utilisation = self._utilisation_pct(info, previous=self._cpu_seen.get(key), now=now)
            cpu_seen[key] = (info.cpu_seconds, now)
            process = ProcessSample(
                pid=info.pid,
                memory_mib=_int_env(info.environ, SIM_MEM_ENV, DEFAULT_MEM_MIB),
                allocation=info.allocation,
                slurm_job=info.slurm_job,
                pod=info.pod,
                state=info.state,
                launch_token=info.launch_token,
            )
            for index in indices:
                per_gpu[index].append((process, utilisation))
        self._cpu_seen = cpu_seen
        return tuple(
            self._gpu_sample(gpu, per_gpu[gpu.index], at=at, now=now) for gpu in self._gpus
        )

    def _tagged_processes(self) -> list[tuple[ProcessInfo, tuple[int, ...]]]:
        """This node's processes and the simulated GPUs each is on: GPUMARKET_SIM_GPU, else
        every GPU in CUDA_VISIBLE_DEVICES (what `gpumarket run` sets), as a real process is
        listed on each GPU it uses."""
        found = []
        for pid in pids_list(proc=self._proc):
            info = process_describe(pid, proc=self._proc)
            if info is None or info.environ.get(SIM_NODE_ENV) != self._node:
                continue
            named = info.environ.get(SIM_GPU_ENV, info.environ.get(CUDA_DEVICES_ENV, ""))
            indices = tuple(sorted({_index(part) for part in named.split(",")}))
            if not indices or not all(0 <= i < len(self._gpus) for i in indices):
                logger.warning(
                    "pid %d names simulated GPU(s) %r, which node %s does not have",
                    pid,
                    named,
                    self._node,
                )
                continue
            # Mapped only once known to be on a GPU: the scan above reads every process.
            found.append((self._mapper.apply(info), indices))
        return launch_paths_adopt(found)

    def _utilisation_pct(
        self, info: ProcessInfo, *, previous: tuple[float, float] | None, now: float
    ) -> float:
        """Percent of one CPU used since the previous sample (lifetime average when new)."""
        if info.state == "stopped":
            return 0.0
        if previous is not None:
            cpu_before, at_before = previous
            elapsed = now - at_before
            used = info.cpu_seconds - cpu_before
        else:
            elapsed = uptime_read(proc=self._proc) - info.start_ticks / CLOCK_TICKS_PER_SECOND
            used = info.cpu_seconds
        if elapsed <= 0:
            return 0.0
        return min(max(used / elapsed * 100.0, 0.0), 100.0)

    def _gpu_sample(
        self,
        gpu: GpuInfo,
        processes: list[tuple[ProcessSample, float]],
        *,
        at: datetime,
        now: float,
    ) -> GpuSample:
        utilisation = round(min(sum(share for _, share in processes), 100.0))
        # A simple linear power model and a temperature that follows it: enough for the
        # charts to move with the work, and obviously not a measurement.
        power_w = self._idle_power_w + (self._max_power_w - self._idle_power_w) * utilisation / 100
        cap = self.power_caps.get(gpu.index)
        if cap is not None:
            power_w = min(power_w, float(cap))
        memory_used = sum(process.memory_mib for process, _ in processes)
        return GpuSample(
            gpu=gpu.uuid,
            at=at,
            utilization_pct=utilisation,
            memory_used_mib=min(memory_used, self._memory_total_mib),
            memory_total_mib=self._memory_total_mib,
            power_w=round(power_w, 1),
            temperature_c=round(32.0 + 0.5 * utilisation, 1),
            energy_j=round(self._meters[gpu.uuid].add(power_w=power_w, at_monotonic=now), 3),
            processes=tuple(process for process, _ in processes),
            health=self._health_take(gpu.index),
        )


def launch_paths_adopt(
    found: list[tuple[ProcessInfo, tuple[int, ...]]],
) -> list[tuple[ProcessInfo, tuple[int, ...]]]:
    """Report a Slurm job's launch path as the job's work.

    `srun gpumarket run ...` in a batch script leaves the batch shell and `srun` carrying the
    job's environment (so, here, its simulated GPU) but no launch token, which the work
    `gpumarket run` replaced itself with has. A process without a token is given the
    allocation and token of its job's tokened work when it is in the same Slurm job, has the
    same owner, and claims that allocation or none; a job whose work carries more than one
    (allocation, token) lends none. NVML never lists such processes; this backend must not
    either as untokened GPU work, or the owner's own job would be paused for them.
    """
    lent: dict[tuple[str, int], set[tuple[int | None, str]]] = {}
    for info, _ in found:
        if info.launch_token and info.slurm_job and info.uid is not None:
            lent.setdefault((info.slurm_job, info.uid), set()).add(
                (info.allocation, info.launch_token)
            )
    adopted = []
    for info, indices in found:
        works = lent.get((info.slurm_job or "", info.uid if info.uid is not None else -1), set())
        if not info.launch_token and len(works) == 1:
            [(allocation, token)] = works
            if info.allocation in (None, allocation):
                info = replace(info, allocation=allocation, launch_token=token)
        adopted.append((info, indices))
    return adopted


def _index(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return -1


def _int_env(environ: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(environ.get(key, default))
    except ValueError:
        return default
