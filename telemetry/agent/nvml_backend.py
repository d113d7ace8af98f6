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
from telemetry.agent.protocol import GpuHealth, GpuInfo, GpuSample, ProcessSample, utcnow
from telemetry.agent.topology import nvml_topology

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
# nvmlClocksThrottleReason* bits that say something about the GPU's health, by the names the
# protocol uses (idle, application-clock and sync-boost reasons are left out).
THROTTLE_BITS = {
    0x4: "power",  # SwPowerCap
    0x8: "hw_slowdown",  # HwSlowdown
    0x20: "thermal",  # SwThermalSlowdown
    0x40: "hw_thermal",  # HwThermalSlowdown
    0x80: "hw_power_brake",  # HwPowerBrakeSlowdown
}
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC, AGGREGATE_ECC = 1, 0, 1


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
        self._no_ecc: set[str] = set()
        self._events = self._xid_events_register()

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def sample(self) -> tuple[GpuSample, ...]:
        samples = []
        xids = self._xids_drain()
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            try:
                samples.append(self._sample_one(gpu, handle, xid=tuple(xids.get(gpu.uuid, ()))))
            except pynvml.NVMLError_GpuIsLost:
                logger.error("GPU %s (%s) is lost: it fell off the bus", gpu.index, gpu.uuid)
                samples.append(self._lost(gpu))
            except pynvml.NVMLError as exc:
                # One failing GPU (fallen off the bus, reset in progress) must not hide
                # the others; the server sees the gap in that GPU's samples.
                logger.warning("NVML could not read GPU %s (%s): %s", gpu.index, gpu.uuid, exc)
        return tuple(samples)

    def power_cap_set(self, index: int, watts: int | None) -> None:
        """Set GPU ``index``'s power management limit to ``watts`` (None: the GPU's default
        limit), kept within the range the board allows. Needs root; NVML's error (e.g.
        NoPermission) is raised for the loop to log."""
        handle = self._handles[index]
        if watts is None:
            milliwatts = int(pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
        else:
            low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            milliwatts = min(max(watts * 1000, int(low)), int(high))
            if milliwatts != watts * 1000:
                logger.warning(
                    "GPU %s allows %d-%d W; power limit set to %d W, not %d W",
                    index,
                    int(low) // 1000,
                    int(high) // 1000,
                    milliwatts // 1000,
                    watts,
                )
        pynvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            logger.exception("NVML shutdown failed")

    def _xid_events_register(self) -> Any:
        """An NVML event set that collects XID errors of every GPU (None where the driver
        cannot: then no XID is reported)."""
        try:
            events = pynvml.nvmlEventSetCreate()
            for handle in self._handles:
                pynvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, events)
        except pynvml.NVMLError as exc:
            logger.warning("NVML cannot report XID errors on this host: %s", exc)
            return None
        return events

    def _xids_drain(self) -> dict[str, list[int]]:
        """{GPU uuid: XID codes} of the events since the previous sample, without waiting."""
        found: dict[str, list[int]] = {}
        if self._events is None:
            return found
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
                uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError:  # a timeout: no more events
                return found
            found.setdefault(uuid, []).append(int(data.eventData))

    def _health(self, gpu: GpuInfo, handle: Any, *, xid: tuple[int, ...]) -> GpuHealth:
        """ECC counts and throttle reasons; a reading the GPU does not support counts as
        none (consumer GPUs have no ECC)."""
        volatile = aggregate = 0
        if gpu.uuid not in self._no_ecc:
            try:
                volatile = int(
                    pynvml.nvmlDeviceGetTotalEccErrors(
                        handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC
                    )
                )
                aggregate = int(
                    pynvml.nvmlDeviceGetTotalEccErrors(
                        handle, MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC
                    )
                )
            except pynvml.NVMLError:
                self._no_ecc.add(gpu.uuid)
        try:
            reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        except pynvml.NVMLError:
            reasons = 0
        return GpuHealth(
            xid=xid,
            ecc_volatile_uncorrected=volatile,
            ecc_aggregate_uncorrected=aggregate,
            throttle=tuple(name for bit, name in THROTTLE_BITS.items() if reasons & bit),
        )

    def _lost(self, gpu: GpuInfo) -> GpuSample:
        """The sample of a GPU NVML can no longer reach: no readings, only that it is lost."""
        return GpuSample(
            gpu=gpu.uuid,
            at=self._wall(),
            utilization_pct=0,
            memory_used_mib=0,
            memory_total_mib=max(gpu.memory_total_mib, 1),
            power_w=0.0,
            temperature_c=0.0,
            energy_j=0.0,
            health=GpuHealth(lost=True),
        )

    def _sample_one(self, gpu: GpuInfo, handle: Any, *, xid: tuple[int, ...] = ()) -> GpuSample:
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
            health=self._health(gpu, handle, xid=xid),
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
