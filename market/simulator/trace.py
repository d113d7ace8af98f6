"""Job traces and measured throughputs.

A trace has one job a line, seven tab-separated fields: job type, command, steps argument
name, needs-data flag, total steps, arrival time (seconds), scale factor (GPUs the job needs
at once), and optionally an eighth: the job's observed GPU utilisation, the share of the
GPU-time it holds that it computes (0-1; see spare.py). Only the type, steps, arrival, scale
and utilisation are used. Throughputs come from a JSON file
keyed by GPU type, then by the text ``"('<job type>', <scale>)"``; the ``"null"`` entry is the
job's throughput (steps/s of the whole gang) alone on that GPU type.
"""

from __future__ import annotations

import ast
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from market.simulator.errors import SimulationError


@dataclass(frozen=True)
class Job:
    """One training job of a trace.

    ``throughput`` is steps/s of the whole gang (``scale`` GPUs) on each GPU type.
    ``extrapolated`` is true when the table had no entry for this scale and the throughput was
    scaled from a smaller gang (see ``throughput_for``).
    """

    id: int
    job_type: str
    scale: int
    steps: int
    arrival: float  # seconds from the start of the trace
    tenant: int  # index into the simulated tenants, 0..N-1
    throughput: dict[str, float]
    extrapolated: bool = False
    utilisation: float | None = None  # share of its held GPU-time it computes, if observed

    def rate(self, gpus: dict[str, float]) -> float:
        """Steps/s given ``gpus[type]`` GPUs (possibly fractional) of each type.

        The fluid model of heterogeneity-aware schedulers: x GPUs of a type for a while are
        x/scale of that while on the job's whole gang, so progress is linear in x.
        """
        return sum(self.throughput[t] * x / self.scale for t, x in gpus.items() if x > 0)


Throughputs = dict[str, dict[tuple[str, int], float]]


def throughputs_load(path: str | Path) -> Throughputs:
    """{gpu type: {(job type, scale): steps/s alone}} from a throughputs JSON file."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise SimulationError(f"throughputs file {path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise SimulationError(f"throughputs file {path} is not valid JSON: {exc}") from exc
    table: Throughputs = {}
    for gpu_type, entries in raw.items():
        if not isinstance(entries, dict):
            continue
        per_type: dict[tuple[str, int], float] = {}
        for key, value in entries.items():
            try:
                job_type, scale = ast.literal_eval(key)
            except (ValueError, SyntaxError) as exc:
                raise SimulationError(
                    f"throughputs file {path}: key {key!r} under {gpu_type!r} is not "
                    "\"('<job type>', <scale>)\""
                ) from exc
            alone = value.get("null") if isinstance(value, dict) else None
            if isinstance(alone, int | float) and alone > 0:
                per_type[(str(job_type), int(scale))] = float(alone)
        table[gpu_type] = per_type
    return table


def throughput_for(
    table: Throughputs, gpu_type: str, job_type: str, scale: int
) -> tuple[float, bool]:
    """Steps/s of ``job_type`` on ``scale`` GPUs of ``gpu_type``, and whether it was extrapolated.

    The table measures gangs of 1, 2, 4 and 8 GPUs and not every (type, scale) pair; traces
    also hold larger gangs. A missing pair is scaled linearly from the largest measured gang
    of that job type no larger than ``scale`` (or the smallest measured gang), i.e. it assumes
    weak scaling; the report counts the jobs this touched.
    """
    per_type = table.get(gpu_type)
    if per_type is None:
        raise SimulationError(
            f"no throughputs for GPU type {gpu_type!r}; the table has {sorted(table)}"
        )
    exact = per_type.get((job_type, scale))
    if exact is not None:
        return exact, False
    measured = sorted(s for (name, s) in per_type if name == job_type)
    if not measured:
        raise SimulationError(
            f"no throughput for job type {job_type!r} on {gpu_type!r}; check the trace and "
            "the throughputs file belong together"
        )
    smaller = [s for s in measured if s <= scale]
    base = smaller[-1] if smaller else measured[0]
    return per_type[(job_type, base)] * scale / base, True


def trace_load(
    path: str | Path,
    *,
    throughputs: Throughputs,
    gpu_types: list[str],
    tenants: int | Literal["jobs"],
    seed: int = 0,
    max_jobs: int | None = None,
) -> list[Job]:
    """Jobs of a trace file, each assigned to one of ``tenants`` tenants by a seeded draw, or
    with ``tenants="jobs"`` each its own tenant (tenant i = the i-th job of the file), the
    setting of Gavel, Themis and Shockwave."""
    per_job = tenants == "jobs"
    if not per_job and (not isinstance(tenants, int) or tenants < 1):
        raise SimulationError(f"need at least one tenant, got {tenants}")
    if max_jobs is not None and max_jobs < 1:
        raise SimulationError(f"--max-jobs must be at least 1, got {max_jobs}")
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError as exc:
        raise SimulationError(f"trace file {path} does not exist") from exc
    rng = random.Random(seed)
    jobs: list[Job] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (7, 8):
            raise SimulationError(
                f"{path}:{number}: expected 7 tab-separated fields, found {len(fields)} "
                "(an eighth, the observed utilisation, is optional)"
            )
        job_type, _command, _steps_arg, _needs_data, steps, arrival, scale = fields[:7]
        utilisation = None
        if len(fields) == 8:
            try:
                utilisation = float(fields[7])
            except ValueError:
                utilisation = math.nan
            if not 0 < utilisation <= 1:
                raise SimulationError(
                    f"{path}:{number}: utilisation (field 8) must be a share in (0, 1], "
                    f"got {fields[7]!r}"
                )
        try:
            steps_n, arrival_s, scale_n = int(steps), float(arrival), int(scale)
        except ValueError as exc:
            raise SimulationError(
                f"{path}:{number}: total steps, arrival and scale must be numbers ({exc})"
            ) from exc
        if steps_n < 1 or scale_n < 1 or arrival_s < 0:
            raise SimulationError(
                f"{path}:{number}: steps and scale must be positive and arrival not negative"
            )
        throughput: dict[str, float] = {}
        extrapolated = False
        for gpu_type in gpu_types:
            value, guessed = throughput_for(throughputs, gpu_type, job_type, scale_n)
            throughput[gpu_type] = value
            extrapolated = extrapolated or guessed
        jobs.append(
            Job(
                id=len(jobs),
                job_type=job_type,
                scale=scale_n,
                steps=steps_n,
                arrival=arrival_s,
                tenant=len(jobs) if per_job else rng.randrange(int(tenants)),
                throughput=throughput,
                extrapolated=extrapolated,
                utilisation=utilisation,
            )
        )
        if max_jobs is not None and len(jobs) >= max_jobs:
            break
    if not jobs:
        raise SimulationError(f"trace file {path} holds no jobs")
    jobs.sort(key=lambda j: (j.arrival, j.id))
    return jobs
