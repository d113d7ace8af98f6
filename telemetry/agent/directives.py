"""What every executor shares: the Executor protocol and the helpers that pick a directive's
targets and combine their outcomes. The registry (executors.py) imports the executors; they
import this, never the registry.

`apply` returns the outcome at once, or None when the action takes time (a termination
waiting out its grace period); such outcomes come back later from `poll`, which the loop
calls every iteration. Neither may block for long: the loop that calls them is also the
one that samples the GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess


class Executor(Protocol):
    name: str

    def apply(
        self, directive: Directive, *, observed: Mapping[int, ObservedProcess]
    ) -> DirectiveResult | None: ...

    def poll(self) -> list[DirectiveResult]: ...


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
