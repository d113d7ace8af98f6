"""Carry out directives through Slurm, so the scheduler knows what happened to its jobs.

Each directive first reads the job's state (`scontrol show job`), then:

- pause -> `scontrol suspend`: the job keeps its resources.
- resume -> a suspended job: `scontrol resume`; a pending held job (requeued by suspend, or
  held while pending): `scontrol release`, and for a requeued one also `scontrol update
  StartTime=now`; a running job: nothing to do. A resume that names a "slurm_reservation"
  (the order's new allocation's) first moves a held job into it (`scontrol update
  ReservationName=`), so it starts on the node reserved for the order.
- terminate -> a running job: `scancel --signal=TERM --full` at once and `scancel` once the
  directive's grace period is over (Slurm then sends its own SIGTERM, and SIGKILL after the
  cluster's KillWait), so a job whose window ended can write a checkpoint; any other job:
  `scancel` at once. Reported when Slurm no longer runs the job.
- suspend -> a running job: `scancel --signal=<checkpoint signal> --full` at once and `scontrol
  requeuehold` once the grace is over; a suspended job: `scontrol requeuehold` at once; a
  pending job: `scontrol hold`. Reported when the job is pending again (its resources
  released); a job that ended during the grace is gone and is not requeued.

What the test cluster (Slurm 22.05, Debian's packages) showed, and why the steps are so:

- `scancel --signal=<sig> [--full]` never returns for a SUSPENDED or a PENDING job (still
  waiting after 20 s, the job untouched), while plain `scancel` cancels either at once and
  `scontrol requeuehold` requeues a suspended job at once (processes killed, PENDING after
  KillWait; no resume needed first). So only a RUNNING job is ever sent a signal.
- Without `--full` (or `--batch`) scancel signals only the job's steps, never the batch
  script: a batch job without `srun` steps gets nothing. `--full` reaches the batch script
  and every step.
- `scontrol requeuehold` needs the job to be requeueable: JobRequeue=1 (Slurm's default, not
  set by scripts/slurm.sh) or `sbatch --requeue`; a job submitted with `--no-requeue` is
  refused ("Requested operation is presently disabled"). It also requeues a job that has
  already ended (even a cancelled one), so the state is checked first.
- A requeued job becomes eligible only about 120 s after the requeue (Reason=BeginTime once
  released); resume sets StartTime=now so that it starts as soon as its order wins.

Suspend, resume, hold, release and requeue need a Slurm operator or administrator account; a
refusal comes back as a "failed" outcome with Slurm's message.
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

# Job states in which Slurm still holds the job's resources or may run it.
ACTIVE_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING"}
)
# The Reason of a pending job that will not start until it is released.
REQUEUED_HELD = "job_requeued_in_held_state"
HELD_REASONS = frozenset({REQUEUED_HELD, "JobHeldUser", "JobHeldAdmin"})
_JOB_STATE = re.compile(r"\bJobState=(\S+)")
_JOB_REASON = re.compile(r"\bReason=(\S+)")

# A plain job id, an array task (123_4) or a heterogeneous component (123+1). Anything else
# is refused before it reaches the command line, where it could read as an option.
JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
# What scontrol prints for a job that has already left the controller.
JOB_GONE = re.compile(r"invalid job id|does not exist|already completed", re.IGNORECASE)
# What scontrol requeuehold prints for a job that may not be requeued.
NOT_REQUEUEABLE = re.compile(r"presently disabled", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Job:
    state: str  # JobState as scontrol shows it, e.g. RUNNING
    reason: str

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.reason in HELD_REASONS


@dataclass(slots=True)
class _Stop:
    """A terminate or suspend in progress. Each job is in one of two places: signalled
    (waiting out the grace) or stopping (cancelled or requeued, waiting for Slurm), with the
    state it was found in; `results` are the outcomes of the jobs already settled."""

    directive_id: int
    action: str
    signal: str
    grace_seconds: int
    due_at: float
    signalled: dict[str, str] = field(default_factory=dict)
    stopping: dict[str, str] = field(default_factory=dict)
    results: list[DirectiveResult] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        return bool(self.signalled or self.stopping)


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
        self._stops: list[_Stop] = []

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
        if directive.action == "pause":
            return outcome_combine(
                directive.id,
                [
                    self._command(directive.id, job, [self._scontrol, "suspend", job])
                    for job in jobs
                ],
            )
        if directive.action == "resume":
            self._suspends_cancel(directive, jobs)
            return outcome_combine(
                directive.id,
                [self._resume(directive.id, job, directive.slurm_reservation) for job in jobs],
            )
        if directive.action == "terminate":
            self._suspends_cancel(directive, jobs)
        stop = _Stop(
            directive_id=directive.id,
            action=directive.action,
            signal="TERM" if directive.action == "terminate" else directive.checkpoint_signal,
            grace_seconds=directive.grace_seconds,
            due_at=self._clock() + directive.grace_seconds,
        )
        for job in jobs:
            self._stop_start(stop, job)
        if not stop.waiting:
            return outcome_combine(directive.id, stop.results)
        self._stops.append(stop)
        return None

    def poll(self) -> list[DirectiveResult]:
        """Cancel or requeue the jobs whose grace is over; report the directives whose jobs
        have all stopped."""
        finished: list[DirectiveResult] = []
        waiting: list[_Stop] = []
        for stop in self._stops:
            self._stop_advance(stop)
            if stop.waiting:
                waiting.append(stop)
            else:
                finished.append(outcome_combine(stop.directive_id, stop.results))
        self._stops = waiting
        return finished

    def _resume(self, directive_id: int, job: str, reservation: str | None) -> DirectiveResult:
        shown = self._show(directive_id, job)
        if isinstance(shown, DirectiveResult):
            return shown
        into = ""
        if reservation is not None and (shown.held or shown.reason == REQUEUED_HELD):
            # Before the release, or Slurm could start it outside the order's new reservation.
            moved = self._command(
                directive_id,
                job,
                [self._scontrol, "update", f"JobId={job}", f"ReservationName={reservation}"],
            )
            if moved.outcome != "done":
                return moved
            into = f" into reservation {reservation}"
        if shown.reason == REQUEUED_HELD:
            # Also while the requeue is still COMPLETING: the release holds for when it ends.
            released = self._command(directive_id, job, [self._scontrol, "release", job])
            if released.outcome != "done":
                return released
            return self._command(
                directive_id,
                job,
                [self._scontrol, "update", f"JobId={job}", "StartTime=now"],
                done=f"scontrol release {job} (requeued; StartTime=now){into}",
            )
        if shown.held:
            return self._command(
                directive_id,
                job,
                [self._scontrol, "release", job],
                done=f"scontrol release {job}{into}",
            )
        if shown.state == "RUNNING":
            return DirectiveResult(
                id=directive_id, outcome="done", detail=f"job {job} is running; nothing to do"
            )
        return self._command(directive_id, job, [self._scontrol, "resume", job])

    def _stop_start(self, stop: _Stop, job: str) -> None:
        """Signal a running job; stop any other at once (Slurm never answers a signal for a
        job that is not running)."""
        directive_id = stop.directive_id
        shown = self._show(directive_id, job)
        if isinstance(shown, DirectiveResult):
            stop.results.append(shown)
            return
        if shown.state not in ACTIVE_STATES:
            stop.results.append(
                DirectiveResult(
                    id=directive_id, outcome="gone", detail=f"job {job} has ended ({shown.state})"
                )
            )
            return
        if stop.action == "suspend" and shown.state == "PENDING":
            # Holds no resources; held so that it does not start while its order is out.
            stop.results.append(
                DirectiveResult(
                    id=directive_id, outcome="done", detail=f"job {job} is pending and held"
                )
                if shown.held
                else self._command(directive_id, job, [self._scontrol, "hold", job])
            )
            return
        if shown.state == "RUNNING":
            command = [self._scancel, f"--signal={stop.signal}", "--full", job]
            place = stop.signalled
        else:
            command = self._stop_command(stop, job)
            place = stop.stopping
        result = self._command(directive_id, job, command)
        if result.outcome == "done":
            place[job] = shown.state
        else:
            stop.results.append(result)

    def _stop_command(self, stop: _Stop, job: str) -> list[str]:
        if stop.action == "terminate":
            return [self._scancel, job]
        return [self._scontrol, "requeuehold", job]

    def _stop_advance(self, stop: _Stop) -> None:
        directive_id = stop.directive_id
        for job in list(stop.signalled):
            shown = self._show(directive_id, job)
            if isinstance(shown, DirectiveResult) and shown.outcome == "failed":
                continue  # cannot tell: ask again at the next poll
            if isinstance(shown, DirectiveResult) or shown.state not in ACTIVE_STATES:
                del stop.signalled[job]
                ended = f"job {job} ended after SIG{stop.signal}"
                # A job that ends on its checkpoint signal is not requeued: it chose to end.
                outcome: Outcome = "done" if stop.action == "terminate" else "gone"
                stop.results.append(DirectiveResult(id=directive_id, outcome=outcome, detail=ended))
            elif self._clock() >= stop.due_at:
                logger.info("grace over for directive %d; stopping job %s", directive_id, job)
                result = self._command(directive_id, job, self._stop_command(stop, job))
                del stop.signalled[job]
                if result.outcome == "done":
                    stop.stopping[job] = "RUNNING"
                else:
                    stop.results.append(result)
        for job, state in list(stop.stopping.items()):
            result = self._stopped(stop, job, state)
            if result is not None:
                del stop.stopping[job]
                stop.results.append(result)

    def _stopped(self, stop: _Stop, job: str, state: str) -> DirectiveResult | None:
        """The outcome of a job that was cancelled or requeued, None while Slurm stops it."""
        directive_id = stop.directive_id
        shown = self._show(directive_id, job)
        if isinstance(shown, DirectiveResult):
            return shown if shown.outcome == "gone" else None
        if state == "RUNNING":
            how = f"after {stop.grace_seconds}s grace"
        else:
            how = f"at once ({state}: Slurm cannot signal it)"
        if stop.action == "terminate":
            if shown.state in ACTIVE_STATES:
                return None
            return DirectiveResult(
                id=directive_id, outcome="done", detail=f"job {job} cancelled {how}"
            )
        if shown.state == "PENDING":
            return DirectiveResult(
                id=directive_id, outcome="done", detail=f"job {job} requeued and held {how}"
            )
        if shown.state in ACTIVE_STATES:
            return None
        return DirectiveResult(
            id=directive_id,
            outcome="gone",
            detail=f"job {job} ended ({shown.state}) while being requeued",
        )

    def _suspends_cancel(self, directive: Directive, jobs: list[str]) -> None:
        """A later resume or terminate wins over a suspend still under way for the same job:
        the suspend stops waiting for it and reports."""
        for stop in self._stops:
            if stop.action != "suspend":
                continue
            later = f"directive {directive.id} ({directive.action})"
            for job in jobs:
                if stop.signalled.pop(job, None) is not None:
                    detail = f"job {job}: SIG{stop.signal} sent, not requeued: {later} came first"
                elif stop.stopping.pop(job, None) is not None:
                    detail = f"job {job}: requeued; {later} came before it was pending"
                else:
                    continue
                stop.results.append(
                    DirectiveResult(id=stop.directive_id, outcome="done", detail=detail)
                )

    def _show(self, directive_id: int, job: str) -> _Job | DirectiveResult:
        """The job's state and reason, or the outcome that ends the directive for this job:
        gone when the controller no longer knows it, failed when it cannot say."""
        if not JOB_ID.match(job):
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"not a Slurm job id: {job!r}"
            )
        shown = self._run(directive_id, [self._scontrol, "show", "job", job, "--oneliner"])
        if isinstance(shown, DirectiveResult):
            return shown
        if shown.returncode != 0:
            return self._refused(directive_id, shown, f"scontrol show job {job}")
        state = _JOB_STATE.search(shown.stdout)
        reason = _JOB_REASON.search(shown.stdout)
        return _Job(
            state=state.group(1) if state is not None else "UNKNOWN",
            reason=reason.group(1) if reason is not None else "",
        )

    def _jobs(self, directive: Directive, observed: Mapping[int, ObservedProcess]) -> list[str]:
        if directive.slurm_job is not None:
            return [directive.slurm_job]
        found = {
            entry.process.slurm_job
            for entry in targets_for(directive, observed)
            if entry.process.slurm_job is not None
        }
        return sorted(found)

    def _command(
        self, directive_id: int, job: str, command: list[str], *, done: str = ""
    ) -> DirectiveResult:
        if not JOB_ID.match(job):
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"not a Slurm job id: {job!r}"
            )
        shown = " ".join([command[0].rsplit("/", 1)[-1], *command[1:]])
        completed = self._run(directive_id, command)
        if isinstance(completed, DirectiveResult):
            return completed
        if completed.returncode == 0:
            logger.info("directive %d: %s", directive_id, shown)
            return DirectiveResult(id=directive_id, outcome="done", detail=done or shown)
        return self._refused(directive_id, completed, shown)

    def _run(
        self, directive_id: int, command: list[str]
    ) -> subprocess.CompletedProcess[str] | DirectiveResult:
        shown = " ".join([command[0].rsplit("/", 1)[-1], *command[1:]])
        try:
            return subprocess.run(
                command, capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return DirectiveResult(
                id=directive_id, outcome="failed", detail=f"{shown}: no answer in {self._timeout}s"
            )
        except OSError as exc:
            return DirectiveResult(id=directive_id, outcome="failed", detail=f"{shown}: {exc}")

    @staticmethod
    def _refused(
        directive_id: int, completed: subprocess.CompletedProcess[str], shown: str
    ) -> DirectiveResult:
        message = (completed.stderr or completed.stdout).strip()
        if JOB_GONE.search(message):
            return DirectiveResult(id=directive_id, outcome="gone", detail=f"{shown}: {message}")
        if NOT_REQUEUEABLE.search(message) and "requeuehold" in shown:
            message += " (the job is not requeueable: submitted with --no-requeue, or JobRequeue=0)"
        return DirectiveResult(
            id=directive_id,
            outcome="failed",
            detail=f"{shown} exited {completed.returncode}: {message}",
        )
