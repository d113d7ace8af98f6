"""`gpumarket plan FILE` as an operator runs it: a real process on the database, whose standard
output is the results as JSON and nothing else (HiGHS's banner kept out), so it pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from planning.models import Scenario
from tests.conftest import ROOT
from tests.conftest import test_database_url as database_url  # aliased: pytest would collect test_*
from tests.planning.history import history_build
from tests.planning.test_scenarios import DOCUMENT


@pytest.mark.django_db(transaction=True)
def test_gpumarket_plan_prints_only_json_and_keeps_the_scenario(tmp_path):
    history_build(rounds=8)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(DOCUMENT))
    done = subprocess.run(
        [sys.executable, "-m", "gpumarket", "plan", str(path)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), "DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)  # the whole output parses: no banner before it
    assert printed["status"] == "done"
    assert Scenario.objects.get(pk=printed["scenario"]).status == Scenario.Status.DONE
