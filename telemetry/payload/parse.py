"""Validation of one agent batch (docs/telemetry-protocol.md): JSON in, plain records out.

Every field is checked for type, unit and range before anything is stored, and every problem
is reported against the field that has it (``samples[3].power_w``), so an agent's author can
fix the sender from the response alone. This runs for every sample at tens of thousands of
samples a second, hence the flat loops and exact type checks (``type(x) is int`` also keeps
``true``, which Python counts as an int, out of numeric fields).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any

from telemetry.errors import TelemetryError
from telemetry.payload.reports import (
    ALLOCATION_MAX,
    BACKENDS,
    ECC_MAX,
    ENERGY_MAX_J,
    MAX_DIRECTIVE_RESULTS,
    MAX_ERRORS,
    MAX_GPUS,
    MAX_PROCESSES_PER_SAMPLE,
    MAX_XIDS,
    MEMORY_MAX_MIB,
    OUTCOMES,
    PID_MAX,
    POWER_MAX_W,
    PROCESS_STATES,
    TEMPERATURE_MAX_C,
    TEMPERATURE_MIN_C,
    THROTTLE_REASONS,
    UNREPORTED_MEMORY_MAX_MIB,
    XID_MAX,
    BatchReport,
    DirectiveOutcome,
    GpuHealth,
    GpuReport,
    Limits,
    ProcessReport,
    SampleRow,
)

_NUMBER = (int, float)
# Numeric sample fields checked alike: (name, lowest, highest, what the value must be).
_RANGED_FIELDS = (
    ("utilization_pct", 0, 100, "a percentage 0..100"),
    ("power_w", 0, POWER_MAX_W, f"watts, 0..{POWER_MAX_W:.0f}"),
    (
        "temperature_c",
        TEMPERATURE_MIN_C,
        TEMPERATURE_MAX_C,
        f"degrees Celsius, {TEMPERATURE_MIN_C:.0f}..{TEMPERATURE_MAX_C:.0f}",
    ),
    ("energy_j", 0, ENERGY_MAX_J, f"a cumulative energy counter in joules, 0..{ENERGY_MAX_J:.0e}"),
)


class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}
        self.count = 0

    def add(self, field: str, message: str) -> None:
        self.fields.setdefault(field, []).append(message)
        self.count += 1
        if self.count >= MAX_ERRORS:
            self.fields.setdefault("non_field_errors", []).append(
                f"stopped after {MAX_ERRORS} problems; fix these and send the batch again"
            )
            raise self.refusal()

    def refusal(self, status: int = 400) -> TelemetryError:
        first_field, messages = next(iter(self.fields.items()))
        return TelemetryError(
            f"batch refused: {first_field}: {messages[0]}", errors=self.fields, status=status
        )


def _describe(value: Any) -> str:
    if type(value) is float and not math.isfinite(value):
        return f"{value} (numbers must be finite)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text_problem(value: Any, *, max_length: int, required: bool) -> str:
    """What is wrong with a text field, or "" when nothing is."""
    if value is None and not required:
        return ""
    if type(value) is not str or (required and not value.strip()) or len(value) > max_length:
        return (
            f"must be {'a non-empty' if required else 'a'} string of at most {max_length} "
            f"characters, got {_describe(value)}"
        )
    if "\x00" in value:
        return "must not contain a NUL character"
    return ""


def _text(
    errors: _Errors, data: dict[str, Any], key: str, field: str, *, max_length: int, required: bool
) -> str:
    value = data.get(key)
    problem = _text_problem(value, max_length=max_length, required=required)
    if problem:
        errors.add(field, problem)
        return ""
    return value or ""


def _one_of(value: Any, allowed: frozenset[str] | set[str]) -> bool:
    # Checked as a string first: a list or an object is not hashable, and must not be a 500.
    return type(value) is str and value in allowed


class _Clock:
    """Parses and range-checks timestamps; a batch repeats the same few, so it memoises."""

    def __init__(self, *, now: datetime, limits: Limits) -> None:
        self.now = now
        self.latest = now + limits.clock_skew
        self.earliest = now - limits.max_age
        self.skew = limits.clock_skew
        self.max_age = limits.max_age
        self._seen: dict[str, datetime | str] = {}

    def parse(self, value: Any) -> datetime | str:
        """The time, or a message saying what is wrong with it."""
        if type(value) is not str:
            return f"must be an ISO 8601 time with a timezone, got {_describe(value)}"
        known = self._seen.get(value)
        if known is not None:
            return known
        result: datetime | str
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            result = f"must be an ISO 8601 time with a timezone, got {_describe(value)}"
        else:
            if moment.tzinfo is None or moment.utcoffset() is None:
                result = f"must carry a timezone offset (e.g. +00:00), got {value!r}"
            elif moment > self.latest:
                ahead = (moment - self.now).total_seconds()
                result = (
                    f"{value} is {ahead:.0f}s ahead of the server's clock (allowed skew "
                    f"{self.skew.total_seconds():.0f}s); check the node's clock (NTP)"
                )
            elif moment < self.earliest:
                result = (
                    f"{value} is older than {self.max_age.total_seconds():.0f}s; "
                    "samples that old are no longer accepted"
                )
            else:
                result = moment
        self._seen[value] = result
        return result


def _gpus_parse(errors: _Errors, raw: Any) -> tuple[GpuReport, ...]:
    if type(raw) is not list:
        errors.add("gpus", f"must be a list of the node's GPUs, got {_describe(raw)}")
        return ()
    if len(raw) > MAX_GPUS:
        errors.add("gpus", f"lists {len(raw)} GPUs; a node may have at most {MAX_GPUS}")
        return ()
    gpus: list[GpuReport] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        field = f"gpus[{i}]"
        if type(item) is not dict:
            errors.add(field, f"must be an object, got {_describe(item)}")
            continue
        gpu_uuid = _text(errors, item, "uuid", f"{field}.uuid", max_length=100, required=True)
        index = item.get("index")
        if type(index) is not int or not 0 <= index <= 1023:
            errors.add(f"{field}.index", f"must be a whole number 0..1023, got {_describe(index)}")
        name = _text(errors, item, "name", f"{field}.name", max_length=120, required=True)
        memory = item.get("memory_total_mib")
        if type(memory) is not int or not 1 <= memory <= MEMORY_MAX_MIB:
            errors.add(
                f"{field}.memory_total_mib",
                f"must be a whole number of MiB, 1..{MEMORY_MAX_MIB}, got {_describe(memory)}",
            )
        # Topology labels are optional (agents before 0.2 do not send them).
        nvlink = _text(
            errors, item, "nvlink_domain", f"{field}.nvlink_domain", max_length=64, required=False
        )
        pcie = _text(
            errors, item, "pcie_switch", f"{field}.pcie_switch", max_length=64, required=False
        )
        if gpu_uuid in seen:
            errors.add(f"{field}.uuid", f"GPU {gpu_uuid} is listed twice")
        if gpu_uuid:
            seen.add(gpu_uuid)
            gpus.append(
                GpuReport(gpu_uuid, index, name, memory, nvlink or "", pcie or "")  # type: ignore[arg-type]
            )
    return tuple(gpus)


def _claim(
    refused: dict[str, list[str]], item: dict[str, Any], key: str, where: str, max_length: int
) -> str:
    """A work claim a process sets in its own environment (SLURM_JOB_ID, POD_NAME): a bad one
    is dropped and named, never a reason to refuse the node's batch."""
    problem = _text_problem(item.get(key), max_length=max_length, required=False)
    if problem:
        refused.setdefault(f"{where}.{key}", []).append(f"{problem}; dropped")
        return ""
    return item.get(key) or ""


def _processes_parse(
    errors: _Errors, raw: Any, field: str, refused: dict[str, list[str]]
) -> tuple[tuple[ProcessReport, ...], list[Any]]:
    """The processes of one sample. What the agent measures (pid, memory, state) must be
    right or the batch is refused; what a process claims about itself (its allocation, Slurm
    job or pod) is untrusted: a bad claim is dropped and named in ``refused``, and the process
    is kept, unclaimed, so enforcement still sees it. Items past the limit are returned
    unread, to be counted as unreported work."""
    if type(raw) is not list:
        errors.add(field, f"must be a list, got {_describe(raw)}")
        return (), []
    extra: list[Any] = []
    if len(raw) > MAX_PROCESSES_PER_SAMPLE:
        refused.setdefault(field, []).append(
            f"has {len(raw)} processes; kept the first {MAX_PROCESSES_PER_SAMPLE} and counted "
            "the rest as unreported work"
        )
        raw, extra = raw[:MAX_PROCESSES_PER_SAMPLE], raw[MAX_PROCESSES_PER_SAMPLE:]
    processes = []
    for j, item in enumerate(raw):
        where = f"{field}[{j}]"
        if type(item) is not dict:
            errors.add(where, f"must be an object, got {_describe(item)}")
            continue
        pid = item.get("pid")
        if type(pid) is not int or not 1 <= pid <= PID_MAX:
            errors.add(f"{where}.pid", f"must be a process id 1..{PID_MAX}, got {_describe(pid)}")
        memory = item.get("memory_mib")
        if type(memory) is not int or not 0 <= memory <= MEMORY_MAX_MIB:
            errors.add(
                f"{where}.memory_mib",
                f"must be a whole number of MiB, 0..{MEMORY_MAX_MIB}, got {_describe(memory)}",
            )
        state = item.get("state")
        if not _one_of(state, PROCESS_STATES):
            errors.add(f"{where}.state", f"must be 'running' or 'stopped', got {_describe(state)}")
        allocation = item.get("allocation")
        if allocation is not None and (
            type(allocation) is not int or not 1 <= allocation <= ALLOCATION_MAX
        ):
            refused.setdefault(f"{where}.allocation", []).append(
                "must be an allocation id (a positive whole number) or null, got "
                f"{_describe(allocation)}; dropped"
            )
            allocation = None
        slurm_job = _claim(refused, item, "slurm_job", where, 64)
        pod = _claim(refused, item, "pod", where, 253)
        token = _claim(refused, item, "launch_token", where, 64)
        processes.append(ProcessReport(pid, memory, allocation, slurm_job, pod, state, token))  # type: ignore[arg-type]
    return tuple(processes), extra


def _unreported_parse(
    errors: _Errors,
    raw: Any,
    field: str,
    *,
    listed: tuple[ProcessReport, ...],
    extra: list[Any],
) -> ProcessReport | None:
    """The processes of a GPU its sample did not list (the agent's `unreported` aggregate,
    plus any past this server's limit) as one observation of pid 0: running when some of them
    run and share no running listed process's allocation and launch token, which is what a
    pause of pid 0 stops (docs/telemetry-protocol.md)."""
    count = memory = running = 0
    if raw is not None:
        if type(raw) is not dict:
            errors.add(field, f"must be an object, got {_describe(raw)}")
            return None
        count, memory, running = (raw.get(key) for key in ("count", "memory_mib", "running"))
        if type(count) is not int or not 1 <= count <= PID_MAX:
            errors.add(
                f"{field}.count", f"must be a whole number 1..{PID_MAX}, got {_describe(count)}"
            )
            return None
        if type(memory) is not int or not 0 <= memory <= UNREPORTED_MEMORY_MAX_MIB:
            errors.add(
                f"{field}.memory_mib",
                f"must be a whole number of MiB, 0..{UNREPORTED_MEMORY_MAX_MIB}, got {_describe(memory)}",
            )
            return None
        if type(running) is not int or not 0 <= running <= count:
            errors.add(
                f"{field}.running",
                f"must be a whole number 0..count ({count}), got {_describe(running)}",
            )
            return None
    if extra:
        covered = {(p.allocation, p.launch_token) for p in listed if p.state == "running"}
        for raw_item in extra:
            item = raw_item if type(raw_item) is dict else {}
            size = item.get("memory_mib")
            memory += size if type(size) is int and 0 <= size <= MEMORY_MAX_MIB else 0
            work = (item.get("allocation"), item.get("launch_token") or "")
            if item.get("state") != "stopped" and work not in covered:
                running += 1
        count += len(extra)
    if not count:
        return None
    return ProcessReport(
        pid=0,
        memory_mib=min(memory, UNREPORTED_MEMORY_MAX_MIB),
        allocation=None,
        slurm_job="",
        pod="",
        state="running" if running else "stopped",
    )


def _health_parse(raw: Any, where: str, refused: dict[str, list[str]]) -> GpuHealth | None:
    """A sample's health reading. A bad field is dropped and named in ``refused``, like a
    process claim: the samples are still worth keeping, and the rest of the reading still
    counts (a GPU that says it is lost is lost even if its ECC count is garbage)."""
    if raw is None:
        return None
    if type(raw) is not dict:
        refused.setdefault(where, []).append(f"must be an object, got {_describe(raw)}; dropped")
        return None
    fields: dict[str, Any] = {}
    xid = raw.get("xid", [])
    if (
        type(xid) is not list
        or len(xid) > MAX_XIDS
        or not all(type(code) is int and 0 <= code <= XID_MAX for code in xid)
    ):
        refused.setdefault(f"{where}.xid", []).append(
            f"must be a list of at most {MAX_XIDS} XID codes, whole numbers 0..{XID_MAX}, "
            f"got {_describe(xid)}; dropped"
        )
    else:
        fields["xid"] = tuple(xid)
    for name in ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"):
        count = raw.get(name, 0)
        if type(count) is not int or not 0 <= count <= ECC_MAX:
            refused.setdefault(f"{where}.{name}", []).append(
                f"must be a whole count of errors, 0..{ECC_MAX}, got {_describe(count)}; dropped"
            )
        else:
            fields[name] = count
    throttle = raw.get("throttle", [])
    if type(throttle) is not list or not all(_one_of(r, THROTTLE_REASONS) for r in throttle):
        refused.setdefault(f"{where}.throttle", []).append(
            f"must be a list of {', '.join(sorted(THROTTLE_REASONS))}, got "
            f"{_describe(throttle)}; dropped"
        )
    else:
        fields["throttle"] = tuple(sorted(set(throttle)))
    lost = raw.get("lost", False)
    if type(lost) is not bool:
        refused.setdefault(f"{where}.lost", []).append(
            f"must be true or false, got {_describe(lost)}; dropped"
        )
    else:
        fields["lost"] = lost
    return GpuHealth(**fields)


def _fatal(health: GpuHealth) -> bool:
    return health.lost or bool(health.xid) or health.ecc_volatile_uncorrected > 0


def _samples_parse(
    errors: _Errors,
    raw: Any,
    *,
    clock: _Clock,
    gpu_uuids: set[str],
    max_samples: int,
    refused: dict[str, list[str]],
    health: dict[str, tuple[datetime, GpuHealth]] | None = None,
) -> tuple[list[SampleRow], dict[str, tuple[datetime, tuple[ProcessReport, ...]]]]:
    if not _samples_sized(errors, raw, max_samples=max_samples):
        return [], {}
    rows: list[SampleRow] = []
    latest: dict[str, tuple[datetime, tuple[ProcessReport, ...]]] = {}
    reported: set[tuple[str, datetime]] = set()
    add = errors.add
    parse_time = clock.parse
    for i, s in enumerate(raw):
        if type(s) is not dict:
            add(f"samples[{i}]", f"must be an object, got {_describe(s)}")
            continue
        # The common case first: a sample with every reading right and no processes,
        # unreported work or health reading is checked here in one expression and stored;
        # anything else goes through the checks below, which name each problem.
        gpu = s.get("gpu")
        at = parse_time(s.get("at"))
        used = s.get("memory_used_mib")
        total = s.get("memory_total_mib")
        util = s.get("utilization_pct")
        power = s.get("power_w")
        temperature = s.get("temperature_c")
        energy = s.get("energy_j")
        listed = s.get("processes")
        if (
            type(at) is datetime
            and type(gpu) is str
            and gpu in gpu_uuids
            and type(total) is int
            and 1 <= total <= MEMORY_MAX_MIB
            and type(used) is int
            and 0 <= used <= total
            and (type(util) is float or type(util) is int)
            and 0 <= util <= 100
            and (type(power) is float or type(power) is int)
            and 0 <= power <= POWER_MAX_W
            and (type(temperature) is float or type(temperature) is int)
            and TEMPERATURE_MIN_C <= temperature <= TEMPERATURE_MAX_C
            and (type(energy) is float or type(energy) is int)
            and 0 <= energy <= ENERGY_MAX_J
            and (listed is None or (type(listed) is list and not listed))
            and s.get("unreported") is None
            and s.get("health") is None
            and (gpu, at) not in reported
        ):
            reported.add((gpu, at))
            rows.append((gpu, at, util, used, total, power, temperature, energy))
            previous = latest.get(gpu)
            if previous is None or at >= previous[0]:
                latest[gpu] = (at, ())
            continue
        checked = _sample_check(
            errors, s, f"samples[{i}]", clock=clock, gpu_uuids=gpu_uuids, refused=refused
        )
        if checked is None:
            continue
        row, processes, reading = checked
        gpu, at = row[0], row[1]
        if (gpu, at) in reported:
            add(f"samples[{i}].at", _reported_twice(gpu, s["at"]))
            continue
        reported.add((gpu, at))
        if reading is not None and health is not None:
            _health_keep(health, gpu=gpu, at=at, reading=reading)
        rows.append(row)
        previous = latest.get(gpu)
        if previous is None or at >= previous[0]:
            latest[gpu] = (at, processes)
    return rows, latest


def _reported_twice(gpu: str, at: Any) -> str:
    # The same GPU twice at one instant: two readings of one counter that cannot both be
    # right, and the energy between them would be counted from whichever came first.
    return f"GPU {gpu} is reported twice at {at} in this batch; one sample per GPU per reading"


def _samples_sized(errors: _Errors, raw: Any, *, max_samples: int) -> bool:
    """Whether ``samples`` is a list to read; more than ``max_samples`` refuses the batch
    (413)."""
    if type(raw) is not list:
        errors.add("samples", f"must be a list, got {_describe(raw)}")
        return False
    if len(raw) > max_samples:
        errors.add(
            "samples",
            f"has {len(raw)} samples; a batch may carry at most {max_samples} (send smaller batches)",
        )
        raise errors.refusal(status=413)
    return True


def _sample_check(
    errors: _Errors,
    s: dict[str, Any],
    where: str,
    *,
    clock: _Clock,
    gpu_uuids: set[str],
    refused: dict[str, list[str]],
) -> tuple[SampleRow, tuple[ProcessReport, ...], GpuHealth | None] | None:
    """One sample the fast path did not take, every field checked and each problem named
    (``where``: its place in the batch); its row, processes and health reading, or None
    when a reading is wrong. A wrong process or health entry is dropped and noted in
    ``refused``."""
    add = errors.add
    ok = True
    gpu = s.get("gpu")
    if not _one_of(gpu, gpu_uuids):
        ok = False
        add(
            f"{where}.gpu",
            f"unknown GPU {_describe(gpu)}: a sample's gpu must be the uuid of a GPU in this batch's gpus list",
        )
    at = clock.parse(s.get("at"))
    if type(at) is str:
        ok = False
        add(f"{where}.at", at)
    used = s.get("memory_used_mib")
    total = s.get("memory_total_mib")
    if type(total) is not int or not 1 <= total <= MEMORY_MAX_MIB:
        ok = False
        add(
            f"{where}.memory_total_mib",
            f"must be a whole number of MiB, 1..{MEMORY_MAX_MIB}, got {_describe(total)}",
        )
    elif type(used) is not int or not 0 <= used <= total:
        ok = False
        add(
            f"{where}.memory_used_mib",
            f"must be a whole number of MiB between 0 and memory_total_mib ({total}), got {_describe(used)}",
        )
    util, power, temperature, energy = (s.get(name) for name, *_ in _RANGED_FIELDS)
    for (name, low, high, what), value in zip(
        _RANGED_FIELDS, (util, power, temperature, energy), strict=True
    ):
        if type(value) not in _NUMBER or not low <= value <= high:
            ok = False
            add(f"{where}.{name}", f"must be {what}, got {_describe(value)}")
    processes_raw = s.get("processes")
    processes: tuple[ProcessReport, ...] = ()
    extra: list[Any] = []
    if processes_raw is not None and processes_raw != []:
        processes, extra = _processes_parse(errors, processes_raw, f"{where}.processes", refused)
    unreported = _unreported_parse(
        errors, s.get("unreported"), f"{where}.unreported", listed=processes, extra=extra
    )
    if unreported is not None:
        processes = (*processes, unreported)
    reading = _health_parse(s.get("health"), f"{where}.health", refused)
    if not ok:
        return None
    row = (gpu, at, util, used, total, power, temperature, energy)
    return row, processes, reading  # type: ignore[return-value]


def _health_keep(
    health: dict[str, tuple[datetime, GpuHealth]], *, gpu: str, at: datetime, reading: GpuHealth
) -> None:
    """Keep the GPU's latest health reading, unless an earlier one in the batch reported an
    error (an error is kept over a later clean reading)."""
    kept = health.get(gpu)
    if (
        kept is None
        or (at >= kept[0] and not _fatal(kept[1]))
        or (_fatal(reading) and not _fatal(kept[1]))
    ):
        health[gpu] = (at, reading)


def _results_parse(errors: _Errors, raw: Any) -> tuple[DirectiveOutcome, ...]:
    if raw is None:
        return ()
    if type(raw) is not list:
        errors.add("directive_results", f"must be a list, got {_describe(raw)}")
        return ()
    if len(raw) > MAX_DIRECTIVE_RESULTS:
        errors.add("directive_results", f"has {len(raw)} entries; at most {MAX_DIRECTIVE_RESULTS}")
        return ()
    results = []
    for i, item in enumerate(raw):
        field = f"directive_results[{i}]"
        if type(item) is not dict:
            errors.add(field, f"must be an object, got {_describe(item)}")
            continue
        directive_id = item.get("id")
        if type(directive_id) is not int or directive_id < 1:
            errors.add(f"{field}.id", f"must be a directive id, got {_describe(directive_id)}")
            continue
        outcome = item.get("outcome")
        if not _one_of(outcome, OUTCOMES):
            errors.add(
                f"{field}.outcome", f"must be 'done', 'gone' or 'failed', got {_describe(outcome)}"
            )
            continue
        detail = item.get("detail")
        if detail is None:
            detail = ""
        if type(detail) is not str:
            errors.add(f"{field}.detail", f"must be a string, got {_describe(detail)}")
            continue
        if "\x00" in detail:
            errors.add(f"{field}.detail", "must not contain a NUL character")
            continue
        results.append(DirectiveOutcome(directive_id, outcome, detail[:500]))
    return tuple(results)


def payload_parse(raw: dict[str, Any], *, now: datetime, limits: Limits) -> BatchReport:
    """Check a decoded batch; raise TelemetryError naming every bad field (up to MAX_ERRORS)."""
    errors = _Errors()
    clock = _Clock(now=now, limits=limits)

    batch_id: uuid.UUID | None = None
    raw_id = raw.get("batch_id")
    if raw_id is None:
        errors.add(
            "batch_id",
            "is required: a UUID the agent chooses once per batch, so a retry is stored once",
        )
    else:
        try:
            batch_id = uuid.UUID(raw_id) if type(raw_id) is str else None
        except ValueError:
            batch_id = None
        if batch_id is None:
            errors.add("batch_id", f"must be a UUID, got {_describe(raw_id)}")

    sent_at = raw.get("sent_at")
    sent = clock.parse(sent_at)
    if type(sent) is datetime and abs(sent - now) > limits.clock_skew:
        sent = (
            f"{sent_at} differs from the server's clock by {abs((sent - now).total_seconds()):.0f}s "
            f"(allowed skew {limits.clock_skew.total_seconds():.0f}s); check the node's clock (NTP)"
        )
    if type(sent) is str:
        errors.add("sent_at", sent)

    backend = raw.get("backend")
    if not _one_of(backend, BACKENDS):
        errors.add("backend", f"must be 'nvml' or 'simulated', got {_describe(backend)}")
    agent_version = _text(
        errors, raw, "agent_version", "agent_version", max_length=40, required=True
    )
    hostname = _text(errors, raw, "hostname", "hostname", max_length=255, required=True)
    gpus = _gpus_parse(errors, raw.get("gpus"))
    refused: dict[str, list[str]] = {}
    health: dict[str, tuple[datetime, GpuHealth]] = {}
    rows, latest = _samples_parse(
        errors,
        raw.get("samples"),
        clock=clock,
        gpu_uuids={gpu.uuid for gpu in gpus},
        max_samples=limits.max_samples,
        refused=refused,
        health=health,
    )
    results = _results_parse(errors, raw.get("directive_results"))
    if errors.count:
        raise errors.refusal()
    times = [row[1] for row in rows]
    return BatchReport(
        batch_id=batch_id,  # type: ignore[arg-type]
        sent_at=sent,  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
        agent_version=agent_version,
        hostname=hostname,
        gpus=gpus,
        samples=rows,
        processes=latest,
        directive_results=results,
        first_at=min(times) if times else None,
        last_at=max(times) if times else None,
        refused=refused,
        health=health,
    )
