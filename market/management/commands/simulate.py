"""``gpumarket simulate``: what-if a job trace, or the platform's own past rounds, ran under a
policy. Uses the market's clearing code; writes summary.md, summary.json and report.html."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from market.simulator import (
    POLICIES,
    SimConfig,
    SimulationError,
    markdown_table,
    report_write,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)

MECHANISMS = ("welfare", "fisher", "maxmin")


def _tiers(text: str) -> dict[str, int]:
    tiers: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"--tiers: {part!r} should look like k80=8")
        try:
            tiers[name.strip()] = int(count)
        except ValueError as exc:
            raise CommandError(f"--tiers: {part!r}: the GPU count must be a whole number") from exc
    if not tiers:
        raise CommandError("--tiers needs at least one TYPE=GPUS, e.g. k80=8,p100=8,v100=8")
    return tiers


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
            default="welfare,fisher,maxmin,fcfs",
            help=f"comma-separated: {', '.join(sorted(POLICIES))} (fcfs only for traces)",
        )
        parser.add_argument(
            "--tiers", default="k80=8,p100=8,v100=8", help="GPU type=GPUs, comma-separated"
        )
        parser.add_argument("--tenants", type=int, default=4)
        parser.add_argument(
            "--rounds", type=int, default=None, help="stop after N rounds with work"
        )
        parser.add_argument("--round-minutes", type=float, default=60.0)
        parser.add_argument(
            "--max-jobs", type=int, default=None, help="only the first N jobs of the trace"
        )
        parser.add_argument(
            "--seed", type=int, default=0, help="seeds the job -> tenant assignment"
        )
        parser.add_argument(
            "--whole-gpus",
            action="store_true",
            help="clear with whole GPUs and gangs (slower); the default is the divisible relaxation",
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
            raise CommandError("give --trace FILE (a job trace) or --from-rounds N (past rounds)")
        policies = [p.strip() for p in options["policy"].split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise CommandError(
                f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(sorted(POLICIES))}"
            )
        trace = Path(options["trace"])
        throughputs_path = Path(
            options["throughputs"] or trace.parent / "simulation_throughputs.json"
        )
        tiers = _tiers(options["tiers"])
        config = SimConfig(
            tiers=tiers,
            tenants=options["tenants"],
            round_minutes=options["round_minutes"],
            max_rounds=options["rounds"],
            divisible=not options["whole_gpus"],
        )
        try:
            config.validate()
            jobs = trace_load(
                trace,
                throughputs=throughputs_load(throughputs_path),
                gpu_types=list(tiers),
                tenants=config.tenants,
                seed=options["seed"],
                max_jobs=options["max_jobs"],
            )
            results = []
            for name in policies:
                self.stderr.write(f"simulating {len(jobs)} jobs under {name} ...")
                results.append(simulate(jobs, policy=name, config=config))
        except SimulationError as exc:
            raise CommandError(str(exc)) from exc
        summaries = [summarise(r) for r in results]
        out = Path(options["out"] or Path(settings.VAR_DIR) / "simulations" / trace.stem)
        context = (
            f"{len(jobs)} jobs of {trace.name} ({summaries[0].extrapolated_jobs} with throughput scaled from a "
            f"smaller measured gang), tiers {options['tiers']}, {config.tenants} tenants (seed {options['seed']}), "
            f"{config.round_minutes:g}-minute rounds, {'divisible' if config.divisible else 'whole-GPU'} clearing. "
            f"Machine: {machine()}."
        )
        paths = report_write(
            results=results, summaries=summaries, out=out, command=command, context=context
        )
        self.stdout.write(context + "\n\n" + markdown_table(summaries) + "\n")
        for s in summaries:
            self.stdout.write(
                f"{s.policy}: {s.rounds} rounds in {s.wall_seconds:.1f} s (solver {s.solve_seconds:.1f} s)"
            )
        self.stdout.write(f"report: {paths['html']}  table: {paths['markdown']}")

    def _from_rounds(self, options: dict[str, Any]) -> None:
        from market.models import PolicyVersion
        from market.policy.replay import rounds_replay
        from market.services.policy import policy_active

        last = options["from_rounds"]
        if last < 1:
            raise CommandError(f"--from-rounds must be at least 1, got {last}")
        if options["policy_version"] is not None:
            version = PolicyVersion.objects.filter(number=options["policy_version"]).first()
            if version is None:
                raise CommandError(f"there is no policy version v{options['policy_version']}")
            candidates = [version]
        else:
            names = [
                p.strip() for p in options["policy"].split(",") if p.strip() and p.strip() != "fcfs"
            ]
            unknown = [n for n in names if n not in MECHANISMS]
            if unknown or not names:
                raise CommandError(
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
