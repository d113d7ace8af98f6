"""Real GPUs, read through NVML (the nvidia-ml-py package, module `pynvml`).

Every NVML call goes through the `pynvml` module attribute (never a from-import), which is
also what lets the tests replace the functions with a fake device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pynvml

from telemetry.agent.energy import EnergyMeter
from telemetry.agent.errors import BackendUnavailable
from telemetry.agent.mapping import ENV_ONLY, AllocationMapper
from telemetry.agent.procmap import PROC, process_describe
from telemetry.agent.protocol import GpuInfo, GpuSample, ProcessSample, utcnow
from telemetry.agent.topology import nvml_topology

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        proc: Path = PROC,
        mapper: AllocationMapper = ENV_ONLY,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._proc = proc
        self._mapper = mapper
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(
                f"NVML is not available on this host: {exc}; use --backend simulated"
            ) from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
            topology = nvml_topology(self._handles)
            self._gpus = tuple(
                GpuInfo(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                    nvlink_domain=topology[index][0],
                    pcie_switch=topology[index][1],
                )
                for index, handle in enumerate(self._handles)
            )
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise BackendUnavailable(
                f"NVML is not available on this host: {exc}; use --backend simulated"
            ) from exc
        if not self._gpus:
            pynvml.nvmlShutdown()
            raise BackendUnavailable(
                "NVML is not available on this host: it found no GPUs; use --backend simulated"
            )
        # GPUs without a hardware energy counter (or power sensor) are remembered so the
        # warning is logged once, not every few seconds for the life of the agent.
        self._meters = {gpu.uuid: EnergyMeter() for gpu in self._gpus}
        self._no_energy_counter: set[str] = set()
        self._no_power_sensor: set[str] = set()

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def sample(self) -> tuple[GpuSample, ...]:
        samples = []
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            try:
                samples.append(self._sample_one(gpu, handle))
            except pynvml.NVMLError as exc:
                # One failing GPU (fallen off the bus, reset in progress) must not hide
                # the others; the server sees the gap in that GPU's samples.
                logger.warning("NVML could not read GPU %s (%s): %s", gpu.index, gpu.uuid, exc)
        return tuple(samples)

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            logger.exception("NVML shutdown failed")

    def _sample_one(self, gpu: GpuInfo, handle: Any) -> GpuSample:
        now = self._clock()
        utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        power_w = self._power_w(gpu, handle)
        energy_j = self._energy_j(gpu, handle, power_w=power_w, now=now)
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return GpuSample(
            gpu=gpu.uuid,
            at=self._wall(),
            utilization_pct=min(max(int(utilisation.gpu), 0), 100),
            memory_used_mib=int(memory.used // MIB),
            memory_total_mib=int(memory.total // MIB),
            power_w=power_w,
            temperature_c=float(temperature),
            energy_j=energy_j,
            processes=tuple(self._process(entry) for entry in processes),
        )

    def _power_w(self, gpu: GpuInfo, handle: Any) -> float:
        if gpu.uuid in self._no_power_sensor:
            return 0.0
        try:
            return float(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # NVML reports milliwatts
        except pynvml.NVMLError_NotSupported:
            logger.warning("GPU %s has no power sensor; reporting 0 W", gpu.uuid)
            self._no_power_sensor.add(gpu.uuid)
            return 0.0

    def _energy_j(self, gpu: GpuInfo, handle: Any, *, power_w: float, now: float) -> float:
        estimate = self._meters[gpu.uuid].add(power_w=power_w, at_monotonic=now)
        if gpu.uuid in self._no_energy_counter:
            return estimate
        try:
            # NVML reports millijoules since the driver was last loaded.
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0
        except pynvml.NVMLError_NotSupported:
            logger.warning(
                "GPU %s has no energy counter; integrating power readings instead", gpu.uuid
            )
            self._no_energy_counter.add(gpu.uuid)
            return estimate

    def _process(self, entry: Any) -> ProcessSample:
        pid = int(entry.pid)
        # usedGpuMemory is None where the driver cannot tell (e.g. some MIG set-ups).
        used = entry.usedGpuMemory or 0
        info = process_describe(pid, proc=self._proc)
        if info is None:
            # Exited since NVML listed it, or in a PID namespace the agent cannot see
            # (run the agent with the host's PID namespace to map container processes).
            return ProcessSample(
                pid=pid,
                memory_mib=int(used // MIB),
                allocation=None,
                slurm_job=None,
                pod=None,
                state="running",
            )
        info = self._mapper.apply(info)
        return ProcessSample(
            pid=pid,
            memory_mib=int(used // MIB),
            allocation=info.allocation,
            slurm_job=info.slurm_job,
            pod=info.pod,
            state=info.state,
            launch_token=info.launch_token,
        )
