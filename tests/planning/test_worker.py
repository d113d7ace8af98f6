"""A scenario run on a real Celery worker, sent over Redis by name as the staff page does."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from planning.models import Scenario
from planning.services.scenarios import scenario_create
from tests.planning.history import history_build
from tests.planning.test_scenarios import DOCUMENT

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_runs_a_queued_scenario_and_records_progress(celery_worker_process, redis_url):
    history = history_build(rounds=6)
    scenario = scenario_create(actor=history.admin, document=DOCUMENT, queue=False)
    broker = Celery(broker=redis_url)
    try:
        broker.send_task("planning.scenario_run", args=[scenario.pk], queue="default")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            scenario.refresh_from_db()
            if scenario.status in (Scenario.Status.DONE, Scenario.Status.FAILED):
                break
            time.sleep(0.3)
    finally:
        broker.close()
    log = celery_worker_process.log_path.read_text()[-3000:]
    assert scenario.status == Scenario.Status.DONE, f"{scenario.error}\n{log}"
    assert scenario.progress_done == scenario.progress_total > 0
    assert scenario.results["tiers"]["a100"]["capacity_after"] == 16
