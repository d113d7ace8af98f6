"""Carry out directives through Slurm, so the scheduler knows what happened to its jobs.

pause -> `scontrol suspend`, resume -> `scontrol resume`, terminate -> `scancel --signal=TERM
--full` at once and `scancel` once the directive's grace period is over (Slurm then sends its
own SIGTERM, and SIGKILL after the cluster's KillWait), so a job whose window
ended (or that was preempted) can write a checkpoint and then is cancelled; its outcome is
reported when Slurm no longer runs it. Suspend and resume need a Slurm operator or
administrator account; a refusal comes back as a "failed" outcome with Slurm's message.

Only a RUNNING job is ever sent a signal: on Slurm 22.05 `scancel --signal=<sig> [--full]`
never returns for a SUSPENDED or a PENDING job (seen on the test cluster: still waiting after
20 s, the job untouched), while plain `scancel` cancels either at once. So terminate reads the
job's state first (`scontrol show job`) and cancels a job that is not running without a grace.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from telemetry.agent.directives import outcome_combine, targets_for
from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess, Outcome

logger = logging.getLogger(__name__)

SCONTROL_VERBS: dict[str, str] = {"pause": "suspend", "resume": "resume"}
# Job states in which Slurm still holds the job's resources or may run it.
ACTIVE_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING"}
)
_JOB_STATE = re.compile(r"\bJobState=(\S+)")

# A plain job id, an array task (123_4) or a heterogeneous component (123+1). Anything else
# is refused before it reaches the command line, where it could read as an option.
JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
# What scontrol prints for a job that has already left the controller.
JOB_GONE = re.compile(r"invalid job id|does not exist|already completed", re.IGNORECASE)


@dataclass(slots=True)
class _Cancel:
    """A terminate in progress. Each job is in one of two places, with the state it was
    found in: signalled (waiting out the grace) or cancelled (waiting for Slurm to end it)."""

    directive_id: int
    grace_seconds: int
    kill_at: float
    signalled: dict[str, str] = field(default_factory=dict)
    cancelled: dict[str, str] = field(default_factory=dict)
    results: list[DirectiveResult] = field(default_factory=list)


class SlurmExecutor:
    name = "slurm"

    def __init__(
        self,
        *,
        scontrol: str = "scontrol",
        scancel: str = "scancel",
        timeout_seconds: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        tools = {}
        for tool in (scontrol, scancel):
            found = shutil.which(tool)
            if found is None:
                raise ExecutorUnavailable(
                    f"{tool!r} is not on PATH; the slurm executor needs Slurm's client tools"
                )
            tools[tool] = found
        self._scontrol = tools[scontrol]
        self._scancel = tools[scancel]
        self._timeout = timeout_seconds
        self._clock = clock
        self._cancels: list[_Cancel] = []

    def apply(
        self, directive: Directive, *, observed: Mapping[int, ObservedProcess]
    ) -> DirectiveResult | None:
        jobs = self._jobs(directive, observed)
        if not jobs:
            return DirectiveResult(
                id=directive.id,
                outcome="failed",
                detail="directive names no Slurm job and none of its processes is in one",
            )
        if directive.action != "terminate":
            return outcome_combine(directive.id, [self._run(directive, job) for job in jobs])
        cancel = _Cancel(
            directive_id=directive.id,
            grace_seconds=directive.grace_seconds,
            kill_at=self._clock() + directive.grace_seconds,
        )
        results = [self._terminate(cancel, job) for job in jobs]
        if not cancel.signalled and not cancel.cancelled:
            return outcome_combine(directive.id, results)
        cancel.results = [r for r in results if r.outcome != "done"]
        self._cancels.append(cancel)
        return None

    def poll(self) -> list[DirectiveResult]:
        """Cancel the jobs whose grace is over; report those Slurm no longer runs."""
        finished: list[DirectiveResult] = []
        waiting: list[_Cancel] = []
        for cancel in self._cancels:
            self._cancel_advance(cancel)
            if cancel.signalled or cancel.cancelled:
                waiting.append(cancel)
            else:
                finished.append(outcome_combine(cancel.directive_id, cancel.results))
        self._cancels = waiting
        return finished

    def _terminate(self, cancel: _Cancel, job: str) -> DirectiveResult:
        """Signal a running job (it is cancelled once the grace is over); cancel any other
        job at once, because Slurm never answers a signal for a job that is not running."""
        shown = self._show(cancel.directive_id, job)
        if isinstance(shown, DirectiveResult):
            return shown
        if shown == "RUNNING":
            command = [self._scancel, "--signal=TERM", "--full", job]
            target = cancel.signalled
        else:
            command = [self._scancel, job]
            target = cancel.cancelled
        result = self._command(cancel.directive_id, job, command)
        if result.outcome == "done":
            target[job] = shown
        return result

    def _cancel_advance(self, cancel: _Cancel) -> None:
        directive_id = cancel.directive_id
        for job in list(cancel.signalled):
            if not self._active(job):
                del cancel.signalled[job]
                cancel.results.append(self._done(directive_id, f"job {job} ended after SIGTERM"))
            elif self._clock() >= cancel.kill_at:
                logger.info("grace over for directive %d; scancel %s", directive_id, job)
                self._command(directive_id, job, [self._scancel, job])
                del cancel.signalled[job]
                cancel.cancelled[job] = "RUNNING"
        for job, state in list(cancel.cancelled.items()):
            if self._active(job):
                continue
            del cancel.cancelled[job]
            detail = (
                f"job {job} cancelled after {cancel.grace_seconds}s grace"
                if state == "RUNNING"
                else f"job {job} cancelled at once ({state}: Slurm cannot signal it)"
            )
            cancel.results.append(self._done(directive_id, detail))

    @staticmethod
    def _done(directive_id: int, detail: str) -> DirectiveResult:
        return DirectiveResult(id=directive_id, outcome="done", detail=detail)

    def _show(self, directive_id: int, job: str) -> str | DirectiveResult:
        """The job's state (JobState, e.g. RUNNING), or the outcome that ends the directive
        for this job: gone when the controller no longer knows it, failed when it cannot say."""
        if not JOB_ID.match(job):
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"not a Slurm job id: {job!r}"
            )
        try:
            shown = subprocess.run(
                [self._scontrol, "show", "job", job, "--oneliner"],
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return DirectiveResult(
                id=directive_id,
                outcome="failed",
                detail=f"scontrol show job {job}: no answer in {self._timeout}s",
            )
        except OSError as exc:
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"scontrol show job {job}: {exc}"
            )
        message = (shown.stderr or shown.stdout).strip()
        if shown.returncode != 0:
            outcome: Outcome = "gone" if JOB_GONE.search(message) else "failed"
            return DirectiveResult(
                id=directive_id, outcome=outcome, detail=f"scontrol show job {job}: {message}"
            )
        state = _JOB_STATE.search(shown.stdout)
        return state.group(1) if state is not None else "UNKNOWN"

    def _active(self, job: str) -> bool:
        shown = self._show(0, job)
        if isinstance(shown, DirectiveResult):
            return shown.outcome != "gone"  # cannot tell: ask again at the next poll
        return shown in ACTIVE_STATES

    def _jobs(self, directive: Directive, observed: Mapping[int, ObservedProcess]) -> list[str]:
        if directive.slurm_job is not None:
            return [directive.slurm_job]
        found = {
            entry.process.slurm_job
            for entry in targets_for(directive, observed)
            if entry.process.slurm_job is not None
        }
        return sorted(found)

    def _run(self, directive: Directive, job: str) -> DirectiveResult:
        return self._command(
            directive.id, job, [self._scontrol, SCONTROL_VERBS[directive.action], job]
        )

    def _command(self, directive_id: int, job: str, command: list[str]) -> DirectiveResult:
        if not JOB_ID.match(job):
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"not a Slurm job id: {job!r}"
            )
        shown = " ".join([command[0].rsplit("/", 1)[-1], *command[1:]])
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"{shown}: no answer in {self._timeout}s"
            )
        except OSError as exc:
            return DirectiveResult(id=directive_id, outcome="failed", detail=f"{shown}: {exc}")
        message = (completed.stderr or completed.stdout).strip()
        if completed.returncode == 0:
            logger.info("directive %d: %s", directive_id, shown)
            return DirectiveResult(id=directive_id, outcome="done", detail=shown)
        if JOB_GONE.search(message):
            return DirectiveResult(id=directive_id, outcome="gone", detail=f"{shown}: {message}")
        return DirectiveResult(
            id=directive_id,
            outcome="failed",
            detail=f"{shown} exited {completed.returncode}: {message}",
        )
