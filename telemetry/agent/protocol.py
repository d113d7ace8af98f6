"""The wire protocol between a node agent and the ingest endpoint.

Everything the agent sends or receives is one of these frozen records; `to_wire` turns them
into the JSON shapes documented in docs/telemetry-protocol.md, `directive_parse` validates
what the server sends back. Units are in the field names (MiB, W, J, degrees C, percent).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

AGENT_VERSION = "0.1.0"
INGEST_PATH = "/api/v1/telemetry/ingest"

ProcessState = Literal["running", "stopped"]
Action = Literal["pause", "resume", "terminate", "suspend"]
Outcome = Literal["done", "gone", "failed"]

ACTIONS: frozenset[str] = frozenset({"pause", "resume", "terminate", "suspend"})
# The server's limits on what a process says about itself (telemetry/payload/parse.py). The
# agent sends a claim past them as null, and at most this many processes per GPU, so that no
# process on the node can make the node's batches fail: the process is then reported
# unclaimed, which is what enforcement needs to see.
MAX_SLURM_JOB_CHARS = 64
MAX_POD_CHARS = 253
# A launch token (GPUMARKET_LAUNCH_TOKEN, set by `gpumarket run`) is a SHA-256 HMAC in hex.
MAX_LAUNCH_TOKEN_CHARS = 64
# A sample lists at most this many processes of a GPU one by one; the rest are sent as one
# `unreported` aggregate, which enforcement sweeps with a pause of pid 0 (processes_split).
MAX_PROCESSES_PER_GPU = 256
# The pid of a pause that means "every process of the GPU that the sample did not list and
# that shares no running listed process's allocation and launch token" (no process has 0).
SWEEP_PID = 0


def claim_clip(value: str | None, *, limit: int) -> str | None:
    """``value`` if the server accepts it as a claim, else None."""
    if not value or len(value) > limit or not value.isprintable():
        return None
    return value


def _work_of(process: ProcessSample) -> tuple[int | None, str | None]:
    """What a process runs as, for the sweep: its allocation and launch token as sent."""
    return process.allocation, claim_clip(process.launch_token, limit=MAX_LAUNCH_TOKEN_CHARS)


def _rank(process: ProcessSample) -> tuple[bool, int, int]:
    return process.state != "running", -process.memory_mib, process.pid


def processes_split(
    processes: tuple[ProcessSample, ...],
) -> tuple[tuple[ProcessSample, ...], tuple[ProcessSample, ...]]:
    """The processes a GPU's sample lists one by one, and the rest (unreported).

    Within the limit every process is listed. Past it, one process of each (allocation,
    launch token) is listed first (groups with running work first, then by their GPU
    memory), then the others: work that is listed, running and allowed covers the
    unreported processes that share its allocation and token, and everything else is swept.
    Both keep the backend's order.
    """
    if len(processes) <= MAX_PROCESSES_PER_GPU:
        return tuple(processes), ()
    groups: dict[tuple[int | None, str | None], list[ProcessSample]] = {}
    for process in sorted(processes, key=_rank):
        groups.setdefault(_work_of(process), []).append(process)
    ordered = sorted(
        groups.values(),
        key=lambda group: (_rank(group[0])[0], -sum(p.memory_mib for p in group), group[0].pid),
    )
    heads = [group[0] for group in ordered]
    others = sorted((p for group in ordered for p in group[1:]), key=_rank)
    chosen = {id(p) for p in (heads + others)[:MAX_PROCESSES_PER_GPU]}
    return (
        tuple(p for p in processes if id(p) in chosen),
        tuple(p for p in processes if id(p) not in chosen),
    )


def sweep_targets(processes: tuple[ProcessSample, ...]) -> tuple[ProcessSample, ...]:
    """The processes a pause of pid 0 stops: unreported, running, and of no running listed
    process's allocation and launch token."""
    listed, unreported = processes_split(processes)
    covered = {_work_of(p) for p in listed if p.state == "running"}
    return tuple(p for p in unreported if p.state == "running" and _work_of(p) not in covered)


# Used when the server leaves grace_seconds out: long enough for a training job to write a
# checkpoint on SIGTERM, short enough that a preemption does not hold a GPU for long.
DEFAULT_GRACE_SECONDS = 30
# What `suspend` sends first, without the SIG prefix. The names a job can trap and that mean
# nothing else to the executors (never KILL or STOP, which cannot be caught, nor CONT).
DEFAULT_CHECKPOINT_SIGNAL = "USR1"
CHECKPOINT_SIGNALS: frozenset[str] = frozenset(
    {"HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM", "URG", "XCPU"}
)
# A Slurm reservation name as the platform makes them (letters, digits, '-', '_', '.'), never
# one that could read as an option on scontrol's command line.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("timestamps on the wire must carry a timezone")
    return moment.isoformat()


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: str
    index: int
    name: str
    memory_total_mib: int
    # Topology labels, unique within the node: GPUs with the same nvlink_domain are joined by
    # NVLink (directly or through NVSwitches); "" = not known, or no NVLink.
    nvlink_domain: str = ""
    pcie_switch: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "nvlink_domain": self.nvlink_domain,
            "pcie_switch": self.pcie_switch,
        }


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One compute process on a GPU, already mapped to the work it belongs to."""

    pid: int
    memory_mib: int
    allocation: int | None
    slurm_job: str | None
    pod: str | None
    state: ProcessState
    launch_token: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "memory_mib": self.memory_mib,
            "allocation": self.allocation,
            "slurm_job": claim_clip(self.slurm_job, limit=MAX_SLURM_JOB_CHARS),
            "pod": claim_clip(self.pod, limit=MAX_POD_CHARS),
            "state": self.state,
            "launch_token": claim_clip(self.launch_token, limit=MAX_LAUNCH_TOKEN_CHARS),
        }


# Throttle reasons the agent reports (the server's list, telemetry/payload/reports.py).
THROTTLE_REASONS: frozenset[str] = frozenset(
    {"thermal", "power", "hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"}
)


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What NVML says about a GPU's health: XID errors since the previous sample,
    uncorrectable ECC error counts (since the driver loaded; ever), the throttle reasons in
    force, and whether the GPU is lost (fallen off the bus)."""

    xid: tuple[int, ...] = ()
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    throttle: tuple[str, ...] = ()
    lost: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "xid": list(self.xid),
            "ecc_volatile_uncorrected": self.ecc_volatile_uncorrected,
            "ecc_aggregate_uncorrected": self.ecc_aggregate_uncorrected,
            "throttle": sorted(self.throttle),
            "lost": self.lost,
        }


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU.

    `energy_j` is a cumulative counter (joules since the driver, or the agent, started);
    the server turns consecutive readings into energy used, and a decrease means a reset.
    """

    gpu: str
    at: datetime
    utilization_pct: int
    memory_used_mib: int
    memory_total_mib: int
    power_w: float
    temperature_c: float
    energy_j: float
    processes: tuple[ProcessSample, ...] = ()
    health: GpuHealth | None = None

    def to_wire(self) -> dict[str, Any]:
        listed, unreported = processes_split(self.processes)
        wire: dict[str, Any] = {
            "gpu": self.gpu,
            "at": _iso(self.at),
            "utilization_pct": self.utilization_pct,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "power_w": self.power_w,
            "temperature_c": self.temperature_c,
            "energy_j": self.energy_j,
            "processes": [process.to_wire() for process in listed],
        }
        if self.health is not None:
            wire["health"] = self.health.to_wire()
        if unreported:
            wire["unreported"] = {
                "count": len(unreported),
                "memory_mib": sum(p.memory_mib for p in unreported),
                "running": len(sweep_targets(self.processes)),
            }
        return wire


@dataclass(frozen=True, slots=True)
class DirectiveResult:
    id: int
    outcome: Outcome
    detail: str

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "outcome": self.outcome, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Batch:
    """One POST body, frozen when built so that a retry resends the same content.

    Only `sent_at` changes between attempts: it is the moment of the attempt, so that the
    server can judge clock skew even for a batch that waited in the backlog.
    """

    backend: str
    hostname: str
    gpus: tuple[GpuInfo, ...]
    samples: tuple[GpuSample, ...]
    directive_results: tuple[DirectiveResult, ...] = ()
    batch_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def to_wire(self, *, sent_at: datetime) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "sent_at": _iso(sent_at),
            "backend": self.backend,
            "agent_version": AGENT_VERSION,
            "hostname": self.hostname,
            "gpus": [gpu.to_wire() for gpu in self.gpus],
            "samples": [sample.to_wire() for sample in self.samples],
            "directive_results": [result.to_wire() for result in self.directive_results],
        }


@dataclass(frozen=True, slots=True)
class Directive:
    id: int
    action: Action
    gpu: str | None
    pid: int | None
    allocation: int | None
    slurm_job: str | None
    pod: str | None
    namespace: str | None
    grace_seconds: int
    reason: str
    # For suspend: the signal sent at once, without the SIG prefix (one of CHECKPOINT_SIGNALS).
    checkpoint_signal: str = DEFAULT_CHECKPOINT_SIGNAL
    # For resume of a Slurm job: the reservation of the allocation it resumes under, which a
    # released job is moved into (set only when the server makes Slurm reservations).
    slurm_reservation: str | None = None


@dataclass(frozen=True, slots=True)
class ObservedProcess:
    """A process the agent reported in its latest sample, with the GPU it was seen on.

    Executors act only on work the agent has itself observed, so a wrong or forged
    directive cannot make a root agent signal an arbitrary process on the host.
    """

    gpu: str
    process: ProcessSample


class DirectiveInvalid(ValueError):
    """The server sent a directive this agent cannot act on; `directive_id` if it had one."""

    def __init__(self, message: str, *, directive_id: int | None) -> None:
        super().__init__(message)
        self.directive_id = directive_id


def _optional_int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer or null, not {value!r}")
    return value


def _optional_str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        # Slurm job ids are numbers; accept a server that sends them unquoted.
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string or null, not {value!r}")
    return value


def _checkpoint_signal(raw: Mapping[str, Any]) -> str:
    value = raw.get("checkpoint_signal")
    if value is None or value == "":
        return DEFAULT_CHECKPOINT_SIGNAL
    name = value.upper().removeprefix("SIG") if isinstance(value, str) else ""
    if name not in CHECKPOINT_SIGNALS:
        raise ValueError(
            f"checkpoint_signal must be one of {', '.join(sorted(CHECKPOINT_SIGNALS))} "
            f"(with or without SIG), not {value!r}"
        )
    return name


def _slurm_reservation(raw: Mapping[str, Any]) -> str | None:
    value = _optional_str(raw, "slurm_reservation")
    if value is not None and not SLURM_NAME.match(value):
        raise ValueError(f"slurm_reservation must be a Slurm name, not {value!r}")
    return value


def directive_parse(raw: object) -> Directive:
    """Validate one entry of the response's `directives` list."""
    if not isinstance(raw, Mapping):
        raise DirectiveInvalid(f"directive is not an object: {raw!r}", directive_id=None)
    directive_id = raw.get("id")
    if isinstance(directive_id, bool) or not isinstance(directive_id, int):
        raise DirectiveInvalid(f"directive has no integer id: {raw!r}", directive_id=None)
    action = raw.get("action")
    if action not in ACTIONS:
        raise DirectiveInvalid(f"unknown action {action!r}", directive_id=directive_id)
    try:
        grace = _optional_int(raw, "grace_seconds")
        directive = Directive(
            id=directive_id,
            action=action,
            gpu=_optional_str(raw, "gpu"),
            pid=_optional_int(raw, "pid"),
            allocation=_optional_int(raw, "allocation"),
            slurm_job=_optional_str(raw, "slurm_job"),
            pod=_optional_str(raw, "pod"),
            namespace=_optional_str(raw, "namespace"),
            grace_seconds=DEFAULT_GRACE_SECONDS if grace is None else max(grace, 0),
            reason=str(raw.get("reason") or ""),
            checkpoint_signal=_checkpoint_signal(raw),
            slurm_reservation=_slurm_reservation(raw),
        )
    except ValueError as exc:
        raise DirectiveInvalid(str(exc), directive_id=directive_id) from exc
    return directive
