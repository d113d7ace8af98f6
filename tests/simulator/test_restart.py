"""The restart cost: jobs as standing orders whose bids come from ``market.orders``, gangs
that lose ``restart_seconds`` of progress after each preemption, and nothing changed at 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from market.orders import restart_value
from market.simulator import (
    BASELINES,
    MARKET,
    Job,
    SimConfig,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)
from market.simulator.policies import POLICIES, View
from market.simulator.policies.market import job_bid

DATA = Path(__file__).parent / "data"
ROUND = 360.0  # seconds: 6-minute rounds

# The first 40 jobs of msr_seed0_2869ce on 4 + 4 + 4 GPUs, 6-minute rounds, measured before
# the restart cost existed (commit 99e14ec): sum of finish times and the last finish, seconds.
BEFORE = {
    "welfare": (36942052.69383682, 1354463.516439714),
    "fisher": (37045657.96131646, 1351584.844844289),
    "maxmin": (36977160.1034954, 1349332.9410693278),
    "gavel-maxmin": (36981862.923438326, 1349042.2173878723),
    "gavel-maxsum": (37517814.521289945, 1369558.4548742725),
    "ftf": (37079803.627489895, 1351188.3467510887),
    "fifo": (42162764.966503255, 2814467.8060658295),
    "fairshare": (42162764.966503255, 2814467.8060658295),
}


def two_jobs(b_arrival: float = 100.0) -> list[Job]:
    """Two standing orders of one tenant (so no entitlement splits the GPUs between them).
    A runs alone first; B, a little faster on the v100 (1.15 vs 1.1 over the k80), arrives
    during round 0. Limits: A 1,100 / 1,000, B 1,150 / 1,000 per GPU-hour."""
    return [
        Job(
            id=0,
            job_type="a",
            scale=1,
            steps=36_000,
            arrival=0.0,
            tenant=0,
            throughput={"v100": 1.1, "k80": 1.0},
        ),
        Job(
            id=1,
            job_type="b",
            scale=1,
            steps=36_000,
            arrival=b_arrival,
            tenant=0,
            throughput={"v100": 1.15, "k80": 1.0},
        ),
    ]


def view(jobs: list[Job], *, running: dict[int, str], restart_seconds: int) -> View:
    return View(
        now=ROUND,
        jobs=tuple(jobs),
        tiers={"v100": 1, "k80": 1},
        remaining={j.id: float(j.steps) for j in jobs},
        running=running,
        usage={},
        weights=(1,),
        round_seconds=ROUND,
        restart_seconds=restart_seconds,
    )


@pytest.mark.parametrize("policy", [*MARKET, *BASELINES])
def test_restart_zero_changes_nothing(policy):
    table = throughputs_load(DATA / "simulation_throughputs.json")
    jobs = trace_load(
        DATA / "head40.trace", throughputs=table, gpu_types=["k80", "p100", "v100"], tenants="jobs"
    )
    config = SimConfig(tiers={"k80": 4, "p100": 4, "v100": 4}, tenants=len(jobs), round_minutes=6)
    result = simulate(jobs, policy=policy, config=config)
    finishes = [o.finish for o in result.jobs]
    assert None not in finishes
    assert (sum(finishes), max(finishes)) == pytest.approx(BEFORE[policy], rel=1e-12)
    assert all(o.lost_seconds == 0 for o in result.jobs)


def test_an_incumbents_bid_carries_the_restart_value_on_its_own_tier_only():
    a, b = two_jobs()
    bid = job_bid(a, view([a, b], running={0: "v100"}, restart_seconds=60))
    premium = restart_value(value=1_100, restart_seconds=60, window_seconds=360)
    assert premium == 184
    assert bid.limits == {"k80": 1_000, "v100": 1_100 + premium}
    assert bid.charge_limits == {"k80": 1_000, "v100": 1_100}  # it pays its value, no more
    assert bid.quantity == 1
    assert job_bid(b, view([a, b], running={0: "v100"}, restart_seconds=60)).limits == {
        "k80": 1_000,
        "v100": 1_150,
    }


def fractions(plan, job_id: int) -> dict[str, float]:
    return {t: round(x, 6) for t, x in plan.fractions.get(job_id, {}).items() if x > 1e-6}


@pytest.mark.parametrize("mechanism", MARKET)
def test_the_clearing_keeps_an_incumbent_for_a_gain_smaller_than_the_restart(mechanism):
    # Moving A to the k80 and B to the v100 gains 50 per GPU-hour: less than A's restart
    # value (184), so the clearing keeps A where it runs; with no restart cost it moves A.
    jobs = two_jobs()
    plan = POLICIES[mechanism].make()
    kept = plan(view(jobs, running={0: "v100"}, restart_seconds=60))
    assert fractions(kept, 0) == {"v100": 1.0} and fractions(kept, 1) == {"k80": 1.0}
    moved = plan(view(jobs, running={0: "v100"}, restart_seconds=0))
    assert fractions(moved, 0) == {"k80": 1.0} and fractions(moved, 1) == {"v100": 1.0}


def test_an_incumbent_kept_by_its_restart_value_is_not_preempted():
    config = SimConfig(tiers={"v100": 1, "k80": 1}, tenants=1, round_minutes=6)
    moved = simulate(two_jobs(), policy="welfare", config=config)
    assert moved.rounds[1].placed == {0: "k80", 1: "v100"}
    # A goes to the k80 when B arrives and back once B is done, at no cost.
    assert moved.jobs[0].preemptions == 2 and moved.jobs[0].lost_seconds == 0
    kept = simulate(
        two_jobs(),
        policy="welfare",
        config=SimConfig(
            tiers={"v100": 1, "k80": 1}, tenants=2, round_minutes=6, restart_seconds=60
        ),
    )
    assert [o.preemptions for o in kept.jobs] == [0, 0]
    assert kept.rounds[1].placed == {0: "v100", 1: "k80"}
    # A ran on the v100 throughout: 36,000 steps at 1.1 steps/s.
    assert kept.jobs[0].finish == pytest.approx(36_000 / 1.1)


def test_each_restart_loses_restart_seconds_of_progress():
    # Two identical jobs share one GPU under max-min: they take turns (in leases of 17
    # rounds, 1.7 h, each longer than a restart costs), and each turn after the first costs
    # the job that resumes its first 60 s.
    jobs = [
        Job(
            id=i,
            job_type="x",
            scale=1,
            steps=36_000,
            arrival=0.0,
            tenant=i,
            throughput={"v100": 1.0},
        )
        for i in range(2)
    ]
    config = SimConfig(tiers={"v100": 1}, tenants=2, round_minutes=6, restart_seconds=60)
    result = simulate(jobs, policy="gavel-maxmin", config=config)
    assert all(o.preemptions > 0 for o in result.jobs)
    for o in result.jobs:
        assert o.lost_seconds == 60 * o.preemptions
    # The GPU was busy for the work (72,000 s) plus every restart.
    busy = sum(r.busy_gpu_seconds for r in result.rounds)
    assert busy == pytest.approx(72_000 + 60 * sum(o.preemptions for o in result.jobs))
    # Rounds run back to back; the GPU idles only after the first job ends, within a round.
    last = max(o.finish for o in result.jobs)
    assert busy <= last < busy + ROUND
    summary = summarise(result)
    assert summary.preemptions_total == sum(o.preemptions for o in result.jobs)
    assert summary.preemptions_max == max(o.preemptions for o in result.jobs)
    assert summary.preemptions_mean == pytest.approx(summary.preemptions_total / 2)
    assert summary.restart_seconds == 60
    # No job was stopped within its lease: every turn lasted 17 rounds or more.
    ran = [r.placed for r in result.rounds]
    turns = [i for i in range(1, len(ran)) if ran[i] != ran[i - 1]]
    assert turns and all(b - a >= 17 for a, b in zip([0, *turns], turns, strict=False))
    assert summary.preemptions_total == len(turns) - 1  # the last: a job finished
    free = simulate(
        jobs, policy="gavel-maxmin", config=SimConfig(tiers={"v100": 1}, tenants=2, round_minutes=6)
    )
    assert max(o.finish for o in free.jobs) == pytest.approx(72_000)


@pytest.mark.parametrize(
    ("rounds_left", "runs_on"),
    [
        (5, True),  # a restart would cost 3.3 % of a 30-minute run: it runs on to its end
        (16, False),  # 1.6 h more would leave it more than a lease ahead of its half share
        (20, False),  # 2 h: a restart later costs under 1 % of that run
    ],
)
def test_a_gang_whose_work_ends_soon_after_its_lease_runs_on_to_its_end(rounds_left, runs_on):
    # Two equal jobs share one GPU under max-min in leases of 17 rounds; the first has
    # ``rounds_left`` rounds of work left when its first lease ends.
    jobs = [
        Job(
            id=i,
            job_type="x",
            scale=1,
            steps=(17 + rounds_left) * ROUND if i == 0 else 100 * ROUND,
            arrival=0.0,
            tenant=i,
            throughput={"v100": 1.0},
        )
        for i in range(2)
    ]
    config = SimConfig(tiers={"v100": 1}, tenants=2, round_minutes=6, restart_seconds=60)
    first = simulate(jobs, policy="gavel-maxmin", config=config).jobs[0]
    if runs_on:
        assert first.preemptions == 0
        assert first.finish == pytest.approx((17 + rounds_left) * ROUND)
    else:
        assert first.preemptions == 1  # stopped for the other's turn, a lease or more
        assert first.finish >= (2 * 17 + rounds_left) * ROUND + 60


def test_a_baseline_that_moves_a_gang_pays_the_restart_too():
    # FIFO never preempts; a Gavel policy time-shares and pays.
    jobs = [
        Job(
            id=i,
            job_type="x",
            scale=1,
            steps=3_600,
            arrival=0.0,
            tenant=i,
            throughput={"v100": 1.0},
        )
        for i in range(2)
    ]
    config = SimConfig(tiers={"v100": 1}, tenants=2, round_minutes=6, restart_seconds=60)
    fifo = simulate(jobs, policy="fifo", config=config)
    assert [o.preemptions for o in fifo.jobs] == [0, 0]
    assert max(o.finish for o in fifo.jobs) == pytest.approx(7_200)
    shared = simulate(jobs, policy="gavel-maxsum", config=config)
    assert sum(o.lost_seconds for o in shared.jobs) == 60 * sum(o.preemptions for o in shared.jobs)
