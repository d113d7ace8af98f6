"""Find a process's allocation in its workload manager when its environment does not say.

A process started with GPUMARKET_ALLOCATION needs nothing more (procmap reads it, and it
always wins). Work started without it can still be tagged where its scheduler keeps
metadata about it, which the agent reads here:

- `slurm`: the job's comment, `sbatch --comment=gpumarket:allocation=42`
  (slurm_mapping.py, `scontrol show job`);
- `kubernetes`: the pod's label `gpumarket.io/allocation: "42"` (kubernetes_mapping.py,
  the API server).

This module is the registry: it imports the lookups, which share their cache and parsing
through lookup.py. Nothing here raises into the backends: a process whose allocation cannot
be found is reported with `allocation: null` and the server decides what to do with it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from telemetry.agent.errors import MappingUnavailable
from telemetry.agent.lookup import AllocationSource
from telemetry.agent.procmap import ProcessInfo
from telemetry.agent.slurm_mapping import SlurmAllocations

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AllocationMapper:
    """Fill in `allocation` for processes whose environment does not carry one, asking each
    source in turn. The environment variable always wins."""

    sources: tuple[AllocationSource, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.sources)

    def apply(self, info: ProcessInfo) -> ProcessInfo:
        if info.allocation is not None:
            return info
        for source in self.sources:
            try:
                allocation = source.allocation_for(info)
            except Exception:
                # A bug in one lookup must not cost the node its samples.
                logger.exception("%s lookup failed for pid %d", source.name, info.pid)
                continue
            if allocation is not None:
                return dataclasses.replace(info, allocation=allocation)
        return info


ENV_ONLY = AllocationMapper()


def _kubernetes() -> AllocationSource:
    # Imported only when chosen: the Kubernetes client is slow to import.
    from telemetry.agent.kubernetes_mapping import KubernetesAllocations

    return KubernetesAllocations()


MAPPINGS: dict[str, Callable[[], AllocationSource]] = {
    "slurm": SlurmAllocations,
    "kubernetes": _kubernetes,
}


def mapper_build(*, names: Iterable[str]) -> AllocationMapper:
    """A mapper asking the named sources, in order. Raises MappingUnavailable (an
    AgentError) when a source cannot work on this host."""
    sources = []
    for name in names:
        if name not in MAPPINGS:
            raise MappingUnavailable(
                f"unknown mapping {name!r}; choose from {', '.join(sorted(MAPPINGS))}"
            )
        sources.append(MAPPINGS[name]())
    return AllocationMapper(sources=tuple(sources))
