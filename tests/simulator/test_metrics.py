"""Finish-time fairness with N = jobs contending, short jobs apart, checked by hand."""

from __future__ import annotations

import pytest

from market.simulator import Job, SimConfig, job_fairness, simulate, summarise
from market.simulator.engine import JobOutcome
from market.simulator.metrics import contention, percentile


def job(id: int, *, steps: int, arrival: float) -> Job:
    return Job(
        id=id,
        job_type="test",
        scale=1,
        steps=steps,
        arrival=arrival,
        tenant=id,
        throughput={"v100": 1.0},
    )


def test_contention_is_the_average_number_of_jobs_in_the_system():
    outcomes = [
        JobOutcome(job=job(0, steps=1, arrival=0), first_run=0, finish=100, spend=0),
        JobOutcome(job=job(1, steps=1, arrival=50), first_run=50, finish=150, spend=0),
        JobOutcome(job=job(2, steps=1, arrival=200), first_run=200, finish=300, spend=0),
    ]
    # Job 0: alone for 50 s, with job 1 for 50 s -> 1.5; job 1 likewise; job 2 alone.
    assert contention(outcomes, end=300) == pytest.approx({0: 1.5, 1: 1.5, 2: 1.0})


def test_rho_uses_jobs_contending_and_short_jobs_are_reported_apart():
    # One GPU, one-hour rounds, FIFO. A and B arrive together and need an hour each: A runs
    # in round 0, B in round 1. C arrives mid-way through round 2 and needs half a round.
    a = job(0, steps=3600, arrival=0)
    b = job(1, steps=3600, arrival=0)
    c = job(2, steps=1800, arrival=10_000)
    result = simulate([a, b, c], policy="fifo", config=SimConfig(tiers={"v100": 1}, tenants=3))
    finish = {o.job.id: o.finish for o in result.jobs}
    assert finish == {0: 3600, 1: 7200, 2: 10_800 + 1800}
    fairness = job_fairness(result)
    # A: 2 jobs in the system all along; alone on half the GPU it needs 7200 s.
    assert fairness[0].contention == pytest.approx(2.0)
    assert fairness[0].rho == pytest.approx(3600 / 7200)
    # B: 2 jobs for an hour, then alone for an hour: N = 1.5, isolated 3600 x 1.5.
    assert fairness[1].contention == pytest.approx(1.5)
    assert fairness[1].rho == pytest.approx(7200 / 5400)
    # C waits for the round boundary: JCT 2600 s for 1800 s of work, and it is short.
    assert fairness[2].contention == pytest.approx(1.0)
    assert fairness[2].rho == pytest.approx(2600 / 1800)
    assert [f.short for f in fairness.values()] == [False, False, True]

    summary = summarise(result)
    assert summary.rho_worst == pytest.approx(7200 / 5400)  # C's larger rho is apart
    assert summary.rho_over_one == pytest.approx(0.5)
    assert summary.short_jobs == 1
    assert summary.short_rho_worst == pytest.approx(2600 / 1800)
    assert summary.jct_mean_h == pytest.approx((3600 + 7200 + 2600) / 3 / 3600)
    assert summary.makespan_h == pytest.approx(12_600 / 3600)
    # Rounds 0, 1 and 3 had a job; the GPU was busy 3600 + 3600 + 1800 of 3 x 3600 s.
    assert summary.rounds == 3
    assert summary.utilisation == pytest.approx(9000 / 10_800)


def test_percentile():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    assert percentile([7.0], 95) == 7.0
