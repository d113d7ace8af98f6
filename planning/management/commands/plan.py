"""``gpumarket plan SCENARIO.json``: keep and run a capacity scenario now, in this process,
and print its results as JSON (the same run a worker does for the staff page)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from market.clearing.solvers.highs import banner_silence
from planning.errors import PlanningError
from planning.models import Scenario
from planning.services.scenarios import scenario_create, scenario_run


class Command(BaseCommand):
    help = "Run a capacity scenario (JSON file, or - for stdin) and print its results as JSON."

    def add_arguments(self, parser):
        parser.add_argument("scenario", help="the scenario document (docs/planning.md), or -")

    def handle(self, *args, scenario: str, **options):
        try:
            text = sys.stdin.read() if scenario == "-" else Path(scenario).read_text()
        except OSError as exc:
            raise CommandError(f"cannot read {scenario}: {exc.strerror}") from exc
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{scenario} is not valid JSON: {exc}") from exc
        try:
            kept = scenario_create(actor="cli", document=document, queue=False)
        except PlanningError as exc:
            raise CommandError(str(exc)) from exc
        banner_silence()  # standard output is the result: JSON only
        done = scenario_run(scenario_id=kept.pk)
        self.stdout.write(
            json.dumps(
                {
                    "scenario": done.pk,
                    "status": done.status,
                    "error": done.error,
                    "results": done.results,
                },
                indent=1,
            )
        )
        if done.status != Scenario.Status.DONE:
            raise CommandError(f"scenario {done.pk} failed: {done.error}")
