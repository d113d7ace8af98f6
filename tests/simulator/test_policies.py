"""Each policy's plan on instances checked by hand or against published figures."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from market.simulator import Job
from market.simulator.policies import View, equal_share_rate
from market.simulator.policies.ftf import FinishTimeFairness
from market.simulator.policies.gavel import max_min_fairness, max_sum_throughput
from market.simulator.policies.queues import fair_share, fair_share_factor, fifo

DATA = Path(__file__).parent / "data"
TYPES = ("k80", "p100", "v100")


def view(jobs, tiers, **kwargs) -> View:
    defaults = {
        "now": 0.0,
        "remaining": {j.id: float(j.steps) for j in jobs},
        "running": {},
        "usage": {},
        "weights": tuple([1] * (max(j.tenant for j in jobs) + 1)),
        "round_seconds": 360.0,
    }
    return View(jobs=tuple(jobs), tiers=tiers, **{**defaults, **kwargs})


def job(
    id: int,
    *,
    tenant: int | None = None,
    scale: int = 1,
    arrival: float = 0.0,
    steps: int = 3600,
    **tp,
) -> Job:
    return Job(
        id=id,
        job_type="test",
        scale=scale,
        steps=steps,
        arrival=arrival,
        tenant=id if tenant is None else tenant,
        throughput=tp,
    )


@pytest.fixture(scope="module")
def golden() -> tuple[list[Job], dict[str, int]]:
    """Gavel's instance: the 26 single-GPU job types, sorted, 6 GPUs of each type."""
    raw = json.loads((DATA / "simulation_throughputs.json").read_text())
    keys = sorted(k for k in raw["v100"] if ast.literal_eval(k)[1] == 1)
    assert len(keys) == 26
    jobs = [
        Job(
            id=i,
            job_type=ast.literal_eval(key)[0],
            scale=1,
            steps=1,
            arrival=0.0,
            tenant=i,
            throughput={t: raw[t][key]["null"] for t in TYPES},
        )
        for i, key in enumerate(keys)
    ]
    return jobs, {t: 6 for t in TYPES}


def throughput(j: Job, fractions: dict[str, float]) -> float:
    return sum(j.throughput[t] * x for t, x in fractions.items())


def test_gavel_max_min_gives_every_job_1_2426_times_its_equal_split(golden):
    jobs, tiers = golden
    plan = max_min_fairness(view(jobs, tiers))
    ratios = [throughput(j, plan.fractions[j.id]) / equal_share_rate(j, tiers, 26) for j in jobs]
    assert ratios == pytest.approx([1.2426] * 26, abs=1e-3)


def test_gavel_max_sum_throughput_reaches_560_566(golden):
    jobs, tiers = golden
    plan = max_sum_throughput(view(jobs, tiers))
    assert sum(throughput(j, plan.fractions.get(j.id, {})) for j in jobs) == pytest.approx(
        560.566, abs=1e-3
    )


@pytest.mark.parametrize("planner", [max_min_fairness, max_sum_throughput, FinishTimeFairness()])
def test_plans_fit_the_cluster(golden, planner):
    jobs, tiers = golden
    jobs = [*jobs[:10], job(99, scale=4, k80=1.0, p100=2.0, v100=3.0)]
    plan = planner(view(jobs, tiers, now=100.0))
    for j in jobs:
        assert sum(plan.fractions.get(j.id, {}).values()) <= 1 + 1e-6
    for t, capacity in tiers.items():
        used = sum(plan.fractions.get(j.id, {}).get(t, 0.0) * j.scale for j in jobs)
        assert used <= capacity + 1e-6


def test_finish_time_fairness_equalises_rho_of_two_equal_jobs():
    # One GPU, two identical jobs that just arrived: the fairest plan halves the GPU.
    a, b = job(0, v100=1.0), job(1, v100=1.0)
    plan = FinishTimeFairness()(view([a, b], {"v100": 1}))
    assert plan.fractions[0]["v100"] == pytest.approx(0.5, abs=1e-3)
    assert plan.fractions[1]["v100"] == pytest.approx(0.5, abs=1e-3)


def test_finish_time_fairness_favours_the_job_that_waited():
    # Same jobs, but job 0 has been in the system for an hour without running.
    a, b = job(0, v100=1.0), job(1, v100=1.0, arrival=3600.0)
    plan = FinishTimeFairness()(view([a, b], {"v100": 1}, now=3600.0))
    assert plan.fractions[0]["v100"] > plan.fractions[1]["v100"] + 0.1


def test_fifo_keeps_running_gangs_and_fills_by_arrival_on_the_fastest_type():
    old = job(0, scale=2, v100=2.0, k80=1.0)  # waits: needs 2 GPUs of one type
    running = job(1, arrival=10.0, v100=2.0, k80=1.0)
    new = job(2, arrival=20.0, v100=2.0, k80=1.0)
    plan = fifo(view([old, running, new], {"v100": 2, "k80": 1}, running={1: "v100"}))
    # No preemption: job 1 keeps its v100; job 0 cannot fit (one v100 left); job 2 takes it.
    assert plan.fractions == {1: {"v100": 1.0}, 2: {"v100": 1.0}}


def test_fair_share_puts_the_tenant_that_used_less_first():
    heavy = job(0, tenant=0, v100=1.0)
    light = job(1, tenant=1, arrival=50.0, v100=1.0)
    v = view([heavy, light], {"v100": 1}, usage={0: 9000.0, 1: 1000.0})
    factors = fair_share_factor(v)
    assert factors[0] == pytest.approx(2 ** (-0.9 / 0.5))
    assert factors[1] == pytest.approx(2 ** (-0.1 / 0.5))
    assert fair_share(v).fractions == {1: {"v100": 1.0}}
    assert fifo(v).fractions == {0: {"v100": 1.0}}
