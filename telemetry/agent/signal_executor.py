"""Carry out directives with POSIX signals to the process group of the target process.

Signals go to the whole process group because a training job is rarely one process: data
loader workers and launchers share the group, and stopping only the GPU process would leave
the rest spinning (or deadlock it on a full queue).

suspend sends the directive's checkpoint signal at once and SIGSTOP once its grace is over;
the work is resumed later by a resume directive (SIGCONT). A group that is already stopped
(paused) is not signalled, because it could not act on the signal, and needs no grace. A
resume or terminate for a target whose suspension is still in its grace cancels the SIGSTOP.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from telemetry.agent.directives import outcome_combine, targets_for
from telemetry.agent.procmap import PROC, pids_list, stat_read
from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess

logger = logging.getLogger(__name__)

_IMMEDIATE: dict[str, tuple[signal.Signals, ...]] = {
    "pause": (signal.SIGSTOP,),
    "resume": (signal.SIGCONT,),
    # A stopped process only acts on SIGTERM once continued, so a paused job that is
    # preempted gets SIGCONT right after SIGTERM to let it shut down cleanly.
    "terminate": (signal.SIGTERM, signal.SIGCONT),
}


@dataclass(frozen=True, slots=True)
class _Target:
    pid: int
    pgid: int | None  # None: signal the pid alone (see _target_for)

    @property
    def key(self) -> tuple[str, int]:
        # Two pids of one group are one target: the group gets each signal once.
        return ("pid", self.pid) if self.pgid is None else ("group", self.pgid)

    def alive(self, live_pids: set[int], live_groups: set[int]) -> bool:
        return self.pid in live_pids if self.pgid is None else self.pgid in live_groups

    def describe(self) -> str:
        if self.pgid is None:
            return f"pid {self.pid}"
        return f"process group {self.pgid} (pid {self.pid})"


@dataclass(slots=True)
class _Suspension:
    """A suspend in its grace: `waiting` were sent the checkpoint signal and are stopped when
    the grace is over; `results` are the outcomes of the targets already settled."""

    directive_id: int
    signal: signal.Signals
    grace_seconds: int
    stop_at: float
    waiting: dict[tuple[str, int], _Target]
    results: list[DirectiveResult]


@dataclass(slots=True)
class _Termination:
    directive_id: int
    targets: tuple[_Target, ...]
    grace_seconds: int
    kill_at: float
    killed_at: float | None = None


class SignalExecutor:
    name = "signal"

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        proc: Path = PROC,
        kill_timeout_seconds: float = 30.0,
    ) -> None:
        self._clock = clock
        self._proc = proc
        self._kill_timeout = kill_timeout_seconds
        self._terminations: list[_Termination] = []
        self._suspensions: list[_Suspension] = []

    def apply(
        self, directive: Directive, *, observed: Mapping[int, ObservedProcess]
    ) -> DirectiveResult | None:
        if directive.pid is None and directive.allocation is None:
            return DirectiveResult(
                id=directive.id, outcome="failed", detail="directive names no pid or allocation"
            )
        entries = targets_for(directive, observed)
        if not entries:
            return self._unobserved(directive)
        targets: dict[tuple[str, int], _Target] = {}
        for entry in entries:
            target = self._target_for(entry.process.pid)
            if target is not None:
                targets.setdefault(target.key, target)
        if not targets:
            return DirectiveResult(id=directive.id, outcome="gone", detail="process has exited")
        if directive.action in ("resume", "terminate"):
            self._suspensions_cancel(directive, targets)
        if directive.action == "suspend":
            return self._suspend(directive, list(targets.values()))
        results = [
            self._send(directive.id, target, _IMMEDIATE[directive.action])
            for target in targets.values()
        ]
        combined = outcome_combine(directive.id, results)
        if directive.action != "terminate" or combined.outcome != "done":
            return combined
        signalled = tuple(
            t for t, r in zip(targets.values(), results, strict=True) if r.outcome == "done"
        )
        self._terminations.append(
            _Termination(
                directive_id=directive.id,
                targets=signalled,
                grace_seconds=directive.grace_seconds,
                kill_at=self._clock() + directive.grace_seconds,
            )
        )
        return None

    def poll(self) -> list[DirectiveResult]:
        if not self._terminations and not self._suspensions:
            return []
        now = self._clock()
        live_pids, live_groups = self._live()
        finished = self._suspensions_advance(live_pids, live_groups, now=now)
        waiting: list[_Termination] = []
        for termination in self._terminations:
            alive = [t for t in termination.targets if t.alive(live_pids, live_groups)]
            result = self._advance(termination, alive, now=now)
            if result is None:
                waiting.append(termination)
            else:
                finished.append(result)
        self._terminations = waiting
        return finished

    def _advance(
        self, termination: _Termination, alive: list[_Target], *, now: float
    ) -> DirectiveResult | None:
        directive_id = termination.directive_id
        if not alive:
            if termination.killed_at is None:
                detail = "exited after SIGTERM"
            else:
                detail = f"killed with SIGKILL after {termination.grace_seconds}s grace"
            return DirectiveResult(id=directive_id, outcome="done", detail=detail)
        if termination.killed_at is None:
            if now < termination.kill_at:
                return None
            for target in alive:
                logger.info(
                    "grace over for directive %d; SIGKILL to %s", directive_id, target.describe()
                )
                self._send(directive_id, target, (signal.SIGKILL,))
            termination.killed_at = now
            return None
        if now - termination.killed_at >= self._kill_timeout:
            # Only a process stuck in uninterruptible sleep (usually hung I/O or a wedged
            # driver) survives SIGKILL; say so instead of waiting for ever.
            survivors = ", ".join(target.describe() for target in alive)
            return DirectiveResult(
                id=directive_id,
                outcome="failed",
                detail=f"still alive {self._kill_timeout:.0f}s after SIGKILL: {survivors}",
            )
        return None

    def _suspend(self, directive: Directive, targets: list[_Target]) -> DirectiveResult | None:
        sig = signal.Signals[f"SIG{directive.checkpoint_signal}"]
        suspension = _Suspension(
            directive_id=directive.id,
            signal=sig,
            grace_seconds=directive.grace_seconds,
            stop_at=self._clock() + directive.grace_seconds,
            waiting={},
            results=[],
        )
        for target in targets:
            if self._stopped(target):
                suspension.results.append(
                    DirectiveResult(
                        id=directive.id,
                        outcome="done",
                        detail=f"{target.describe()} already stopped; no {sig.name}",
                    )
                )
                continue
            sent = self._send(directive.id, target, (sig,))
            if sent.outcome == "done":
                suspension.waiting[target.key] = target
            else:
                suspension.results.append(sent)
        if not suspension.waiting:
            return outcome_combine(directive.id, suspension.results)
        self._suspensions.append(suspension)
        return None

    def _suspensions_advance(
        self, live_pids: set[int], live_groups: set[int], *, now: float
    ) -> list[DirectiveResult]:
        """Stop the targets whose grace is over; report the suspensions with none waiting."""
        finished: list[DirectiveResult] = []
        waiting: list[_Suspension] = []
        for suspension in self._suspensions:
            directive_id, name = suspension.directive_id, suspension.signal.name
            for key, target in list(suspension.waiting.items()):
                if not target.alive(live_pids, live_groups):
                    result = DirectiveResult(
                        id=directive_id,
                        outcome="gone",
                        detail=f"{target.describe()} exited after {name}",
                    )
                elif now >= suspension.stop_at:
                    result = self._send(directive_id, target, (signal.SIGSTOP,))
                    if result.outcome == "done":
                        detail = f"{name}, then SIGSTOP after {suspension.grace_seconds}s grace"
                        result = DirectiveResult(
                            id=directive_id, outcome="done", detail=f"{target.describe()}: {detail}"
                        )
                else:
                    continue
                del suspension.waiting[key]
                suspension.results.append(result)
            if suspension.waiting:
                waiting.append(suspension)
            else:
                finished.append(outcome_combine(suspension.directive_id, suspension.results))
        self._suspensions = waiting
        return finished

    def _suspensions_cancel(
        self, directive: Directive, targets: Mapping[tuple[str, int], _Target]
    ) -> None:
        """A later resume or terminate wins over a suspension still in its grace: its
        targets are not stopped; the suspension reports at the next poll."""
        for suspension in self._suspensions:
            for key in targets.keys() & suspension.waiting.keys():
                target = suspension.waiting.pop(key)
                detail = (
                    f"{target.describe()}: {suspension.signal.name} sent; not stopped, "
                    f"directive {directive.id} ({directive.action}) came within the grace"
                )
                suspension.results.append(
                    DirectiveResult(id=suspension.directive_id, outcome="done", detail=detail)
                )

    def _stopped(self, target: _Target) -> bool:
        """Whether every live process of the target is stopped (and there is one)."""
        if target.pgid is None:
            stat = stat_read(target.pid, proc=self._proc)
            return stat is not None and stat.stopped
        found = False
        for pid in pids_list(proc=self._proc):
            stat = stat_read(pid, proc=self._proc)
            if stat is None or stat.exited or stat.pgrp != target.pgid:
                continue
            if not stat.stopped:
                return False
            found = True
        return found

    def _target_for(self, pid: int) -> _Target | None:
        stat = stat_read(pid, proc=self._proc)
        if stat is None or stat.exited:
            return None
        # Never signal the agent's own group (work started from the agent's shell would
        # otherwise take the agent down with it), nor init's or a kernel thread's group.
        if stat.pgrp <= 1 or stat.pgrp == os.getpgrp():
            return _Target(pid=pid, pgid=None)
        return _Target(pid=pid, pgid=stat.pgrp)

    def _send(
        self, directive_id: int, target: _Target, signals: tuple[signal.Signals, ...]
    ) -> DirectiveResult:
        names = "+".join(sig.name for sig in signals)
        try:
            for sig in signals:
                if target.pgid is None:
                    os.kill(target.pid, sig)
                else:
                    os.killpg(target.pgid, sig)
        except ProcessLookupError:
            return DirectiveResult(
                id=directive_id, outcome="gone", detail=f"{target.describe()} has exited"
            )
        except PermissionError as exc:
            return DirectiveResult(
                id=directive_id,
                outcome="failed",
                detail=f"not permitted to signal {target.describe()}: {exc}",
            )
        logger.info("directive %d: %s sent to %s", directive_id, names, target.describe())
        return DirectiveResult(
            id=directive_id, outcome="done", detail=f"{names} sent to {target.describe()}"
        )

    def _unobserved(self, directive: Directive) -> DirectiveResult:
        if directive.pid is None:
            return DirectiveResult(
                id=directive.id,
                outcome="gone",
                detail=f"no process of allocation {directive.allocation} is running here",
            )
        stat = stat_read(directive.pid, proc=self._proc)
        if stat is None or stat.exited:
            return DirectiveResult(
                id=directive.id, outcome="gone", detail=f"pid {directive.pid} has exited"
            )
        return DirectiveResult(
            id=directive.id,
            outcome="failed",
            detail=f"pid {directive.pid} is not a GPU process this agent reported; not signalled",
        )

    def _live(self) -> tuple[set[int], set[int]]:
        """Pids and process groups with at least one process that has not exited.

        Zombies do not count: a terminated child its parent has not reaped yet is gone.
        """
        pids: set[int] = set()
        groups: set[int] = set()
        for pid in pids_list(proc=self._proc):
            stat = stat_read(pid, proc=self._proc)
            if stat is not None and not stat.exited:
                pids.add(pid)
                groups.add(stat.pgrp)
        return pids, groups
