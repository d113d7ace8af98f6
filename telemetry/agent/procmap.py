"""Map a process id to the work it belongs to, from what /proc tells about it.

A process can vanish between any two reads and, when the agent is not root, another user's
environ is unreadable; both are normal here, so every reader returns None (or an empty
mapping) instead of raising.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from telemetry.agent.protocol import (
    MAX_POD_CHARS,
    MAX_SLURM_JOB_CHARS,
    ProcessState,
    claim_clip,
)

logger = logging.getLogger(__name__)

PROC = Path("/proc")
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")

ALLOCATION_ENV = "GPUMARKET_ALLOCATION"
LAUNCH_TOKEN_ENV = "GPUMARKET_LAUNCH_TOKEN"
# Allocation ids are the server's bigint primary keys.
ALLOCATION_MAX = 2**63 - 1
SLURM_JOB_ENV = "SLURM_JOB_ID"
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"

# Slurm's cgroup plugins (v1 and v2) put every step under a `job_<id>` directory.
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?=/|$)")
# The kubelet names pod cgroups `pod<uid>` (cgroupfs driver) or `...-pod<uid_with_underscores>`
# (systemd driver); either way the pod's UID follows the `pod` prefix.
_POD_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the agent uses; CPU times in clock ticks."""

    state: str
    pgrp: int
    cpu_ticks: int
    start_ticks: int

    @property
    def stopped(self) -> bool:
        # "T" is a job-control stop (SIGSTOP), "t" a tracing stop: neither runs.
        return self.state in ("T", "t")

    @property
    def exited(self) -> bool:
        return self.state in ("Z", "X")


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    state: ProcessState
    pgrp: int
    cpu_seconds: float
    start_ticks: int
    allocation: int | None
    slurm_job: str | None
    pod: str | None
    # The pod's namespace when the downward API set POD_NAMESPACE (used to look the pod up).
    namespace: str | None = None
    environ: Mapping[str, str] = field(repr=False, default_factory=dict)
    # Set by `gpumarket run`; the server checks it against the allocation the process claims.
    launch_token: str | None = field(repr=False, default=None)
    # The owner (real uid from /proc/<pid>), None if it could not be read.
    uid: int | None = None

    @property
    def pod_named(self) -> bool:
        """True when `pod` is the pod's name (POD_NAME), False when it is the cgroup's UID."""
        return self.pod is not None and self.environ.get(POD_NAME_ENV) == self.pod


def pids_list(*, proc: Path = PROC) -> list[int]:
    try:
        return sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())
    except OSError:
        logger.exception("cannot list %s", proc)
        return []


def stat_read(pid: int, *, proc: Path = PROC) -> ProcStat | None:
    """Parse /proc/<pid>/stat; None if the process is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses,
    # so the fixed fields are the ones after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcStat(
            state=fields[0],
            pgrp=int(fields[2]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        logger.warning("unreadable /proc/%d/stat: %r", pid, text[:200])
        return None


def environ_read(pid: int, *, proc: Path = PROC) -> dict[str, str] | None:
    """The process's initial environment; None if it is gone, empty if not readable (or read in
    the instant after exec, before the kernel has set the new program's environment up)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return {}
    environ: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            environ[key.decode(errors="replace")] = value.decode(errors="replace")
    return environ


def cgroup_read(pid: int, *, proc: Path = PROC) -> str:
    try:
        return (proc / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def uptime_read(*, proc: Path = PROC) -> float:
    return float((proc / "uptime").read_text().split()[0])


def allocation_id(value: str) -> int | None:
    """The allocation id written in `value`, or None unless it is a whole number the server
    accepts: it refuses a whole batch over one process with an id outside 1..ALLOCATION_MAX."""
    try:
        allocation = int(value.strip())
    except ValueError:
        return None
    return allocation if 1 <= allocation <= ALLOCATION_MAX else None


def allocation_parse(value: str | None) -> int | None:
    if value is None:
        return None
    allocation = allocation_id(value)
    if allocation is None:
        logger.debug("ignoring %s=%r: not an allocation id", ALLOCATION_ENV, value)
    return allocation


def slurm_job_find(environ: Mapping[str, str], cgroup: str) -> str | None:
    """The Slurm job from the environment when it is one the server accepts, else from the
    cgroup (which the process cannot set)."""
    job = claim_clip(environ.get(SLURM_JOB_ENV), limit=MAX_SLURM_JOB_CHARS)
    if job:
        return job
    match = _SLURM_CGROUP.search(cgroup)
    return match.group(1) if match else None


def pod_find(environ: Mapping[str, str], cgroup: str) -> str | None:
    """The pod's name from the downward API (`POD_NAME`), else its UID from the cgroup."""
    name = claim_clip(environ.get(POD_NAME_ENV), limit=MAX_POD_CHARS)
    if name:
        return name
    match = _POD_CGROUP.search(cgroup)
    return match.group(1).replace("_", "-") if match else None


def process_describe(pid: int, *, proc: Path = PROC) -> ProcessInfo | None:
    """Everything the agent reports about `pid`; None if it has exited."""
    stat = stat_read(pid, proc=proc)
    if stat is None or stat.exited:
        return None
    environ = environ_read(pid, proc=proc)
    if environ is None:
        return None
    cgroup = cgroup_read(pid, proc=proc)
    return ProcessInfo(
        pid=pid,
        state="stopped" if stat.stopped else "running",
        pgrp=stat.pgrp,
        cpu_seconds=stat.cpu_ticks / CLOCK_TICKS_PER_SECOND,
        start_ticks=stat.start_ticks,
        allocation=allocation_parse(environ.get(ALLOCATION_ENV)),
        slurm_job=slurm_job_find(environ, cgroup),
        pod=pod_find(environ, cgroup),
        namespace=environ.get(POD_NAMESPACE_ENV) or None,
        environ=environ,
        launch_token=environ.get(LAUNCH_TOKEN_ENV) or None,
        uid=_owner(pid, proc=proc),
    )


def _owner(pid: int, *, proc: Path) -> int | None:
    try:
        return (proc / str(pid)).stat().st_uid
    except OSError:
        return None
