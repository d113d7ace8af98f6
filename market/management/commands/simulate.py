"""``gpumarket simulate``: what-if a job trace, or the platform's own past rounds, ran under a
policy. Uses the market's clearing code; writes summary.md, summary.json and report.html.
Bad input exits with status 2 and a message naming what to fix."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from market.simulator import (
    BASELINES,
    JOB_MODELS,
    MARKET,
    POLICIES,
    SimConfig,
    SimulationError,
    goals,
    markdown_table,
    report_write,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)
from market.simulator.report import summary_json
from market.simulator.spare import IDLE_STRETCHES
from market.spare import IdlePolicy

MECHANISMS = ("welfare", "fisher", "maxmin")
FORMATS = ("text", "markdown", "json")
BAD_INPUT = 2  # exit status for arguments or files the user must fix


def _bad(message: str) -> CommandError:
    return CommandError(message, returncode=BAD_INPUT)


def _spare_context(config: SimConfig) -> str:
    if not config.spare:
        return ""
    reclaim = config.idle_reclaim
    return (
        f", jobs busy {config.utilisation:.0%} of their holding (idle at the {config.idle_stretch})"
        + (
            f", idle reclaim below {reclaim.below_pct} % for {reclaim.idle_minutes}+{reclaim.grace_minutes} min"
            if reclaim
            else ", no idle reclaim"
        )
        + (
            f", backfill every {config.backfill_minutes} min"
            if config.backfill_minutes
            else ", no backfill"
        )
    )


def _idle_policy(text: str | None) -> IdlePolicy | None:
    """``BELOW,IDLE,GRACE,REFUND`` (whole numbers) as the platform's idle-reclaim policy."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise _bad(
            f"--idle-reclaim: four whole numbers BELOW,IDLE,GRACE,REFUND (e.g. 10,10,5,100), "
            f"got {text!r}"
        )
    below, idle, grace, refund = (int(p) for p in parts)
    if not (0 < below <= 100 and idle > 0 and refund <= 100):
        raise _bad("--idle-reclaim: BELOW in 1-100 %, IDLE at least a minute, REFUND at most 100 %")
    return IdlePolicy(below_pct=below, idle_minutes=idle, grace_minutes=grace, refund_pct=refund)


def _tiers(text: str) -> dict[str, int]:
    tiers: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip():
            raise _bad(f"--tiers: {part!r} should look like k80=8")
        try:
            tiers[name.strip()] = int(count)
        except ValueError as exc:
            raise _bad(f"--tiers: {part!r}: the GPU count must be a whole number") from exc
    if not tiers:
        raise _bad("--tiers needs at least one TYPE=GPUS, e.g. k80=8,p100=8,v100=8")
    return tiers


def _tenants(text: str) -> int | str:
    """``jobs`` (every job its own tenant) or a positive number of tenants."""
    if text.strip() == "jobs":
        return "jobs"
    try:
        count = int(text)
    except ValueError as exc:
        raise _bad(f"--tenants must be a positive whole number or 'jobs', got {text!r}") from exc
    if count < 1:
        raise _bad(f"--tenants: need at least one tenant, got {count}")
    return count


@contextlib.contextmanager
def _native_stdout_to_stderr() -> Iterator[None]:
    """Solver libraries print banners straight to file descriptor 1 (HiGHS on every new
    instance); send them to stderr so that stdout carries only the report (--format)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def machine() -> str:
    """A one-line description of the machine, for the report."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"
    )


class Command(BaseCommand):
    help = (
        "Replay a job trace (or the last N recorded rounds) under one or more policies with the "
        "market's clearing code; report utilisation, completion times, finish-time fairness, "
        "Jain's index and spend per tenant."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--trace", help="job trace (tab-separated, one job a line)")
        parser.add_argument(
            "--throughputs",
            help="throughputs JSON (default: simulation_throughputs.json next to the trace)",
        )
        parser.add_argument(
            "--policy",
            default=",".join(MARKET + BASELINES),
            help=(
                f"comma-separated; ours: {', '.join(MARKET)}; baselines: {', '.join(BASELINES)} "
                "(fcfs = fifo); default: all"
            ),
        )
        parser.add_argument(
            "--tiers", default="k80=8,p100=8,v100=8", help="GPU type=GPUs, comma-separated"
        )
        parser.add_argument(
            "--tenants",
            default="4",
            help="N tenants drawn at random per job (--seed), or 'jobs': every job its own tenant",
        )
        parser.add_argument(
            "--rounds", type=int, default=None, help="stop after N rounds with work"
        )
        parser.add_argument(
            "--round-minutes",
            type=float,
            default=60.0,
            help="round length (the platform's default 60; Gavel uses 6)",
        )
        parser.add_argument(
            "--job-model",
            choices=JOB_MODELS,
            default="gang",
            help="gang: whole gangs on one GPU type a round (default); fluid: fractional GPUs",
        )
        parser.add_argument(
            "--half-life-hours",
            type=float,
            default=7 * 24.0,
            help="fair-share: decay half-life of past usage (Slurm's default 7 days)",
        )
        parser.add_argument(
            "--restart-seconds",
            type=int,
            default=0,
            help="progress a gang loses each time it is stopped or moved (default 0: the papers' setting)",
        )
        self._idle_arguments(parser)
        self._output_arguments(parser)

    @staticmethod
    def _idle_arguments(parser: CommandParser) -> None:
        """Idle GPUs within a window: how busy jobs are, idle reclaim and backfill."""
        parser.add_argument(
            "--utilisation",
            type=float,
            default=1.0,
            help="share of the time it holds GPUs a job computes, where the trace does not say "
            "(default 1: always busy)",
        )
        parser.add_argument(
            "--idle-stretch",
            choices=IDLE_STRETCHES,
            default="end",
            help="where a job's idle time falls in its holding: at the end, or in the middle "
            "(its owner comes back)",
        )
        parser.add_argument(
            "--idle-reclaim",
            default=None,
            metavar="BELOW,IDLE,GRACE,REFUND",
            help="reclaim idle GPUs as the platform's policy does: utilisation below BELOW %% "
            "for IDLE minutes, then GRACE more minutes; refund REFUND %% of the unused time "
            "(e.g. 10,10,5,100)",
        )
        parser.add_argument(
            "--backfill-minutes",
            type=int,
            default=None,
            help="offer unsold and reclaimed GPUs in sub-rounds this many minutes apart",
        )

    @staticmethod
    def _output_arguments(parser: CommandParser) -> None:
        """What is printed and written, and the replay of past rounds instead of a trace."""
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="text",
            help="stdout: text (table and timings), markdown (context, command, table, goals), json",
        )
        parser.add_argument(
            "--max-jobs", type=int, default=None, help="only the first N jobs of the trace"
        )
        parser.add_argument(
            "--seed", type=int, default=0, help="seeds the job -> tenant assignment"
        )
        parser.add_argument(
            "--out", default=None, help="report directory (default var/simulations/<name>)"
        )
        parser.add_argument(
            "--from-rounds",
            type=int,
            default=None,
            metavar="N",
            help="instead of a trace, clear the platform's last N settled rounds again",
        )
        parser.add_argument(
            "--policy-version",
            type=int,
            default=None,
            help="with --from-rounds: replay under this stored policy version number",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        command = "gpumarket simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if options["from_rounds"] is not None:
            self._from_rounds(options)
            return
        if not options["trace"]:
            raise _bad("give --trace FILE (a job trace) or --from-rounds N (past rounds)")
        policies = [p.strip() for p in options["policy"].split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise _bad(
                f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(sorted(POLICIES))}"
            )
        trace = Path(options["trace"])
        throughputs_path = Path(
            options["throughputs"] or trace.parent / "simulation_throughputs.json"
        )
        tiers = _tiers(options["tiers"])
        tenants = _tenants(options["tenants"])
        jobs, config, results = self._run(
            options, trace=trace, throughputs_path=throughputs_path, tiers=tiers, tenants=tenants,
            policies=policies,
        )  # fmt: skip
        summaries = [summarise(r) for r in results]
        out = Path(options["out"] or Path(settings.VAR_DIR) / "simulations" / trace.stem)
        who = (
            "one tenant per job"
            if tenants == "jobs"
            else f"{config.tenants} tenants (seed {options['seed']})"
        )
        context = (
            f"{len(jobs)} jobs of {trace.name} ({summaries[0].extrapolated_jobs} with throughput scaled from a "
            f"smaller measured gang, {results[0].shrunk_jobs} gangs larger than any GPU type run on the largest), "
            f"tiers {options['tiers']}, {who}, {config.round_minutes:g}-minute rounds, "
            f"{config.job_model} job model, {config.restart_seconds} s restart cost{_spare_context(config)}. "
            f"Machine: {machine()}."
        )
        paths = report_write(
            results=results, summaries=summaries, out=out, command=command, context=context
        )
        table = markdown_table(summaries)
        checks = "\n".join(goals(summaries))
        if options["format"] == "json":
            self.stdout.write(json.dumps(summary_json(command, context, summaries), indent=2))
            return
        if options["format"] == "markdown":
            self.stdout.write(f"{context}\n\nCommand: `{command}`\n\n{table}\n\n{checks}\n")
            return
        self.stdout.write(context + "\n\n" + table + "\n\n" + checks + "\n")
        for s in summaries:
            self.stdout.write(
                f"{s.policy}: {s.rounds} rounds, {s.plans} plans in {s.wall_seconds:.1f} s "
                f"(policy {s.solve_seconds:.1f} s), {s.preemptions_total} preemptions"
            )
        self.stdout.write(f"report: {paths['html']}  table: {paths['markdown']}")

    def _run(
        self,
        options: dict[str, Any],
        *,
        trace: Path,
        throughputs_path: Path,
        tiers: dict[str, int],
        tenants: str | int,
        policies: list[str],
    ) -> tuple[list, SimConfig, list]:
        """The trace's jobs, the configuration, and one simulation per policy."""
        try:
            jobs = trace_load(
                trace,
                throughputs=throughputs_load(throughputs_path),
                gpu_types=list(tiers),
                tenants="jobs" if tenants == "jobs" else int(tenants),
                seed=options["seed"],
                max_jobs=options["max_jobs"],
            )
            config = SimConfig(
                tiers=tiers,
                tenants=len(jobs) if tenants == "jobs" else int(tenants),
                round_minutes=options["round_minutes"],
                max_rounds=options["rounds"],
                job_model=options["job_model"],
                half_life_hours=options["half_life_hours"],
                restart_seconds=options["restart_seconds"],
                utilisation=options["utilisation"],
                idle_stretch=options["idle_stretch"],
                idle_reclaim=_idle_policy(options["idle_reclaim"]),
                backfill_minutes=options["backfill_minutes"],
            )
            config.validate()
            results = []
            with _native_stdout_to_stderr():
                for name in policies:
                    self.stderr.write(f"simulating {len(jobs)} jobs under {name} ...")
                    results.append(simulate(jobs, policy=name, config=config))
        except SimulationError as exc:
            raise _bad(str(exc)) from exc
        return jobs, config, results

    def _from_rounds(self, options: dict[str, Any]) -> None:
        from market.models import PolicyVersion
        from market.policy.replay import rounds_replay
        from market.services.policy import policy_active

        last = options["from_rounds"]
        if last < 1:
            raise _bad(f"--from-rounds must be at least 1, got {last}")
        if options["policy_version"] is not None:
            version = PolicyVersion.objects.filter(number=options["policy_version"]).first()
            if version is None:
                raise _bad(f"there is no policy version v{options['policy_version']}")
            candidates = [version]
        else:
            # Baselines plan job traces, not recorded bids: past rounds replay only mechanisms.
            names = [
                p.strip()
                for p in options["policy"].split(",")
                if p.strip() and p.strip() not in (*BASELINES, "fcfs")
            ]
            unknown = [n for n in names if n not in MECHANISMS]
            if unknown or not names:
                raise _bad(
                    f"--from-rounds replays auction mechanisms: {', '.join(MECHANISMS)} (got {options['policy']})"
                )
            active = policy_active()
            # Unsaved candidates: the active version's reserves and caps with another mechanism.
            candidates = [
                PolicyVersion(
                    number=active.number,
                    mechanism=name,
                    params=active.params if name == active.mechanism else {},
                    reserve_prices=active.reserve_prices,
                    max_share_pct=active.max_share_pct,
                    round_minutes=active.round_minutes,
                )
                for name in names
            ]
        for candidate in candidates:
            rows, totals = rounds_replay(version=candidate, last=last)
            if not rows:
                raise CommandError("no settled rounds to replay yet")
            label = (
                f"v{candidate.number}"
                if candidate.pk
                else f"{candidate.mechanism} (v{candidate.number}'s reserves)"
            )
            self.stdout.write(
                f"\n{label} over the last {totals.rounds} rounds (recorded -> replayed):"
            )
            self.stdout.write(
                f"  revenue (milli-credits): {totals.revenue_active} -> {totals.revenue_other}"
            )
            self.stdout.write(
                f"  GPUs allocated:          {totals.gpus_active} -> {totals.gpus_other}"
            )
            self.stdout.write(
                f"  mean utilisation:        {_fmt(totals.utilisation_active)} -> {_fmt(totals.utilisation_other)}"
            )
            self.stdout.write(
                f"  mean Jain's index:       {_fmt(totals.fairness_active)} -> {_fmt(totals.fairness_other)}"
            )
            for name, recorded, replayed in totals.tenants:
                self.stdout.write(f"  GPUs to {name}: {recorded} -> {replayed}")
            if totals.errors:
                self.stdout.write(f"  solver errors in {totals.errors} round(s)")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
