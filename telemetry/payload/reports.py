"""What a validated agent batch becomes: plain, frozen records, and the limits it is
checked against (docs/telemetry-protocol.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

MAX_GPUS = 256
# A sample lists at most this many processes one by one; the rest come as one `unreported`
# aggregate, stored as an observation of pid 0 (parse.py).
MAX_PROCESSES_PER_SAMPLE = 256
MAX_DIRECTIVE_RESULTS = 1000
# Enough to fix a sender; more only makes the response large.
MAX_ERRORS = 50
# 16 TiB in MiB: far above any GPU, low enough to catch bytes sent as MiB.
MEMORY_MAX_MIB = 16 * 1024 * 1024
# The GPU memory of a GPU's unreported processes, summed: the column's limit.
UNREPORTED_MEMORY_MAX_MIB = 2**31 - 1
# No GPU draws 10 kW: a larger reading is milliwatts sent as watts.
POWER_MAX_W = 10_000.0
TEMPERATURE_MIN_C, TEMPERATURE_MAX_C = -40.0, 150.0
# A cumulative counter: 10^15 J is a 1 kW GPU running for 30,000 years.
ENERGY_MAX_J = 1e15
# The kernel's upper limit for pid_max.
PID_MAX = 4_194_304
ALLOCATION_MAX = 2**63 - 1
BACKENDS = frozenset({"nvml", "simulated"})
PROCESS_STATES = frozenset({"running", "stopped"})
OUTCOMES = frozenset({"done", "gone", "failed"})


@dataclass(frozen=True, slots=True)
class Limits:
    max_samples: int
    clock_skew: timedelta
    max_age: timedelta

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(
            max_samples=settings.GPUMARKET_INGEST_MAX_SAMPLES,
            clock_skew=timedelta(seconds=settings.GPUMARKET_CLOCK_SKEW_SECONDS),
            max_age=timedelta(seconds=settings.GPUMARKET_SAMPLE_MAX_AGE_SECONDS),
        )


@dataclass(frozen=True, slots=True)
class GpuReport:
    uuid: str
    index: int
    name: str
    memory_total_mib: int
    nvlink_domain: str = ""
    pcie_switch: str = ""


# NVML's throttle reasons that say something about the GPU's health (clocks held down by
# heat or by the power limit), as the agent names them; others (idle, application clocks)
# are not sent.
THROTTLE_REASONS = frozenset(
    {"thermal", "power", "hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"}
)
XID_MAX = 1_000_000
MAX_XIDS = 64
# An ECC counter beyond this is not a count of errors.
ECC_MAX = 2**62


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What NVML said about a GPU's health in one sample (docs/telemetry.md "Health")."""

    xid: tuple[int, ...] = ()  # XID error codes seen since the previous sample
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    throttle: tuple[str, ...] = ()
    lost: bool = False


@dataclass(frozen=True, slots=True)
class ProcessReport:
    pid: int
    memory_mib: int
    allocation: int | None
    slurm_job: str
    pod: str
    state: str
    launch_token: str = ""


@dataclass(frozen=True, slots=True)
class DirectiveOutcome:
    id: int
    outcome: str
    detail: str


# (gpu uuid, at, utilization %, memory used MiB, memory total MiB, power W, temperature C,
# energy counter J): a tuple rather than a record, because the rows go straight to COPY.
SampleRow = tuple[str, datetime, float, int, int, float, float, float]


@dataclass(frozen=True, slots=True)
class BatchReport:
    batch_id: uuid.UUID
    sent_at: datetime
    backend: str
    agent_version: str
    hostname: str
    gpus: tuple[GpuReport, ...]
    samples: list[SampleRow]
    # gpu uuid -> (time of its latest sample, the processes in that sample)
    processes: dict[str, tuple[datetime, tuple[ProcessReport, ...]]]
    directive_results: tuple[DirectiveOutcome, ...]
    first_at: datetime | None
    last_at: datetime | None
    # Untrusted process claims that were dropped, by field, with why: the batch was kept.
    refused: dict[str, list[str]] = field(default_factory=dict)
    # gpu uuid -> (sample time, health) of the latest sample with a health reading; a fatal
    # reading in an earlier sample of the batch wins over a later healthy one.
    health: dict[str, tuple[datetime, GpuHealth]] = field(default_factory=dict)
