"""Carry out directives through Slurm, so the scheduler knows what happened to its jobs.

pause -> `scontrol suspend`, resume -> `scontrol resume`, terminate -> `scontrol requeue`
(preempted work goes back to the queue instead of being lost). These need a Slurm operator
or administrator account; a refusal comes back as a "failed" outcome with scontrol's message.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Mapping

from telemetry.agent.directives import outcome_combine, targets_for
from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess

logger = logging.getLogger(__name__)

SCONTROL_VERBS: dict[str, str] = {"pause": "suspend", "resume": "resume", "terminate": "requeue"}

# A plain job id, an array task (123_4) or a heterogeneous component (123+1). Anything else
# is refused before it reaches the command line, where it could read as an option.
JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
# What scontrol prints for a job that has already left the controller.
JOB_GONE = re.compile(r"invalid job id|does not exist|already completed", re.IGNORECASE)


class SlurmExecutor:
    name = "slurm"

    def __init__(self, *, scontrol: str = "scontrol", timeout_seconds: float = 15.0) -> None:
        found = shutil.which(scontrol)
        if found is None:
            raise ExecutorUnavailable(
                f"{scontrol!r} is not on PATH; the slurm executor needs Slurm's client tools"
            )
        self._scontrol = found
        self._timeout = timeout_seconds

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
        return outcome_combine(directive.id, [self._run(directive, job) for job in jobs])

    def poll(self) -> list[DirectiveResult]:
        return []

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
        if not JOB_ID.match(job):
            return DirectiveResult(
                id=directive.id, outcome="failed", detail=f"not a Slurm job id: {job!r}"
            )
        command = [self._scontrol, SCONTROL_VERBS[directive.action], job]
        shown = f"scontrol {SCONTROL_VERBS[directive.action]} {job}"
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return DirectiveResult(
                id=directive.id, outcome="failed", detail=f"{shown}: no answer in {self._timeout}s"
            )
        except OSError as exc:
            return DirectiveResult(id=directive.id, outcome="failed", detail=f"{shown}: {exc}")
        message = (completed.stderr or completed.stdout).strip()
        if completed.returncode == 0:
            logger.info("directive %d: %s", directive.id, shown)
            return DirectiveResult(id=directive.id, outcome="done", detail=shown)
        if JOB_GONE.search(message):
            return DirectiveResult(id=directive.id, outcome="gone", detail=f"{shown}: {message}")
        return DirectiveResult(
            id=directive.id,
            outcome="failed",
            detail=f"{shown} exited {completed.returncode}: {message}",
        )
