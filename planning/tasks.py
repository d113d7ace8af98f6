"""Celery task: thin, takes the scenario's id; the service holds every decision."""

from __future__ import annotations

from celery import shared_task

from planning.services.scenarios import scenario_run


@shared_task(name="planning.scenario_run")
def scenario_run_task(scenario_id: int) -> dict:
    scenario = scenario_run(scenario_id=scenario_id)
    return {"scenario": scenario.pk, "status": scenario.status}
