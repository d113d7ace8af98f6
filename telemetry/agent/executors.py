"""How a directive is carried out on this node: an Executor per kind of workload manager.

`apply` returns the outcome at once, or None when the action takes time (a termination
waiting out its grace period); such outcomes come back later from `poll`, which the loop
calls every iteration. Neither may block for long: the loop that calls them is also the
one that samples the GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess


class Executor(Protocol):
    name: str

    def apply(
        self, directive: Directive, *, observed: Mapping[int, ObservedProcess]
    ) -> DirectiveResult | None: ...

    def poll(self) -> list[DirectiveResult]: ...


# The executors import the helpers below from this module, so they are imported when
# chosen rather than at the top.
def _signal() -> Executor:
    from telemetry.agent.signal_executor import SignalExecutor

    return SignalExecutor()


def _slurm() -> Executor:
    from telemetry.agent.slurm_executor import SlurmExecutor

    return SlurmExecutor()


def _kubernetes() -> Executor:
    # Imported only when chosen: the Kubernetes client is slow to import and most nodes
    # never need it.
    from telemetry.agent.kubernetes_executor import KubernetesExecutor

    return KubernetesExecutor()


EXECUTORS: dict[str, Callable[[], Executor]] = {
    "signal": _signal,
    "slurm": _slurm,
    "kubernetes": _kubernetes,
}


def executor_build(*, name: str) -> Executor:
    return EXECUTORS[name]()


def targets_for(
    directive: Directive, observed: Mapping[int, ObservedProcess]
) -> list[ObservedProcess]:
    """The observed processes a directive is about: its pid, or every process of its
    allocation (on its GPU, when it names one)."""
    if directive.pid is not None:
        found = observed.get(directive.pid)
        return [found] if found is not None else []
    if directive.allocation is None:
        return []
    return [
        entry
        for entry in observed.values()
        if entry.process.allocation == directive.allocation
        and (directive.gpu is None or entry.gpu == directive.gpu)
    ]


def outcome_combine(directive_id: int, results: list[DirectiveResult]) -> DirectiveResult:
    """One outcome for a directive that acted on several targets: failed if any failed,
    gone only if all were gone, otherwise done."""
    detail = "; ".join(result.detail for result in results)
    outcomes = {result.outcome for result in results}
    if "failed" in outcomes:
        return DirectiveResult(id=directive_id, outcome="failed", detail=detail)
    if outcomes == {"gone"}:
        return DirectiveResult(id=directive_id, outcome="gone", detail=detail)
    return DirectiveResult(id=directive_id, outcome="done", detail=detail)
