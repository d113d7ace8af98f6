"""How a directive is carried out on this node: an Executor per kind of workload manager,
chosen by name (the protocol and the helpers they share are in directives.py)."""

from __future__ import annotations

from collections.abc import Callable

from telemetry.agent.directives import Executor
from telemetry.agent.signal_executor import SignalExecutor
from telemetry.agent.slurm_executor import SlurmExecutor

__all__ = ["EXECUTORS", "Executor", "executor_build"]


def _kubernetes() -> Executor:
    # Imported only when chosen: the Kubernetes client is slow to import and most nodes
    # never need it.
    from telemetry.agent.kubernetes_executor import KubernetesExecutor

    return KubernetesExecutor()


EXECUTORS: dict[str, Callable[[], Executor]] = {
    "signal": SignalExecutor,
    "slurm": SlurmExecutor,
    "kubernetes": _kubernetes,
}


def executor_build(*, name: str) -> Executor:
    return EXECUTORS[name]()
