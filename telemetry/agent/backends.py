"""Where GPU readings come from: a Backend samples every GPU of the node.

Backends are chosen by name from BACKENDS; each entry builds one from the command line's
options. A backend whose hardware is missing raises BackendUnavailable when built, so the
agent fails at start with a clear message instead of posting empty batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from telemetry.agent.mapping import ENV_ONLY, AllocationMapper
from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.protocol import GpuInfo, GpuSample
from telemetry.agent.simulated_backend import SimulatedBackend, spawn_simulated_work


class Backend(Protocol):
    name: str
    """The `backend` field of every batch: "nvml" or "simulated"."""

    def gpus(self) -> tuple[GpuInfo, ...]: ...

    def sample(self) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BackendOptions:
    node_name: str
    sim_gpus: int
    mapper: AllocationMapper = ENV_ONLY
    sim_nvlink_islands: int = 2


def _nvml(options: BackendOptions) -> Backend:
    return NvmlBackend(mapper=options.mapper)


def _simulated(options: BackendOptions) -> Backend:
    return SimulatedBackend(
        options.node_name,
        gpus=options.sim_gpus,
        nvlink_islands=options.sim_nvlink_islands,
        mapper=options.mapper,
    )


BACKENDS: dict[str, Callable[[BackendOptions], Backend]] = {
    "nvml": _nvml,
    "simulated": _simulated,
}


def backend_build(*, name: str, options: BackendOptions) -> Backend:
    return BACKENDS[name](options)


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendOptions",
    "NvmlBackend",
    "SimulatedBackend",
    "backend_build",
    "spawn_simulated_work",
]
