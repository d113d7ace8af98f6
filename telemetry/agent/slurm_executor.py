"""Carry out directives through Slurm, so the scheduler knows what happened to its jobs.

pause -> `scontrol suspend`, resume -> `scontrol resume`, terminate -> `scancel --signal=TERM
--full` at once and `scancel` once the directive's grace period is over (Slurm then sends its
own SIGTERM, and SIGKILL after the cluster's KillWait), so a job whose window
ended (or that was preempted) can write a checkpoint and then is cancelled; its outcome is
reported when Slurm no longer runs it. Suspend and resume need a Slurm operator or
administrator account; a refusal comes back as a "failed" outcome with Slurm's message.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from telemetry.agent.directives import outcome_combine, targets_for
from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess

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
    directive_id: int
    jobs: tuple[str, ...]
    grace_seconds: int
    kill_at: float
    killed: bool = False


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
        results = [
            self._command(directive.id, job, [self._scancel, "--signal=TERM", "--full", job])
            for job in jobs
        ]
        combined = outcome_combine(directive.id, results)
        if combined.outcome != "done":
            return combined
        signalled = tuple(j for j, r in zip(jobs, results, strict=True) if r.outcome == "done")
        self._cancels.append(
            _Cancel(
                directive_id=directive.id,
                jobs=signalled,
                grace_seconds=directive.grace_seconds,
                kill_at=self._clock() + directive.grace_seconds,
            )
        )
        return None

    def poll(self) -> list[DirectiveResult]:
        """Cancel the jobs whose grace is over; report those Slurm no longer runs."""
        finished: list[DirectiveResult] = []
        waiting: list[_Cancel] = []
        for cancel in self._cancels:
            active = [job for job in cancel.jobs if self._active(job)]
            if not active:
                detail = (
                    f"job {' '.join(cancel.jobs)} cancelled after {cancel.grace_seconds}s grace"
                    if cancel.killed
                    else f"job {' '.join(cancel.jobs)} ended after SIGTERM"
                )
                finished.append(
                    DirectiveResult(id=cancel.directive_id, outcome="done", detail=detail)
                )
                continue
            if not cancel.killed and self._clock() >= cancel.kill_at:
                for job in active:
                    logger.info("grace over for directive %d; scancel %s", cancel.directive_id, job)
                    self._command(cancel.directive_id, job, [self._scancel, job])
                cancel.killed = True
            waiting.append(cancel)
        self._cancels = waiting
        return finished

    def _active(self, job: str) -> bool:
        try:
            shown = subprocess.run(
                [self._scontrol, "show", "job", job, "--oneliner"],
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError):
            return True  # cannot tell: ask again at the next poll
        if shown.returncode != 0:
            return not JOB_GONE.search(shown.stderr or shown.stdout)
        state = _JOB_STATE.search(shown.stdout)
        return state is not None and state.group(1) in ACTIVE_STATES

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
