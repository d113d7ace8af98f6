"""The round loop and its metrics: a hand-checked FCFS case, then invariants on the first jobs
of a real trace under every policy (each solver policy runs the market's own clearing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from market.simulator import (
    Job,
    SimConfig,
    SimulationError,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)
from market.simulator.engine import isolated_rate, jain_index, limit_prices

DATA = Path(__file__).parent / "data"
TIERS = {"k80": 8, "p100": 8, "v100": 8}
POLICIES = ["welfare", "fisher", "maxmin", "fcfs"]


def job(
    id: int, *, steps: int, arrival: float, tenant: int, v100: float, k80: float, scale: int = 1
) -> Job:
    return Job(
        id=id,
        job_type="test",
        scale=scale,
        steps=steps,
        arrival=arrival,
        tenant=tenant,
        throughput={"v100": v100, "k80": k80},
    )


def test_fcfs_serves_in_arrival_order_on_the_fastest_free_type():
    # One v100 and one k80, 60-minute rounds. A (first) takes the v100 and needs two rounds;
    # B arrives during round 0, starts at the next boundary on the k80 and needs one round.
    a = job(0, steps=14_400, arrival=0, tenant=0, v100=2.0, k80=1.0)
    b = job(1, steps=3_600, arrival=100, tenant=1, v100=2.0, k80=1.0)
    config = SimConfig(tiers={"v100": 1, "k80": 1}, tenants=2, reserve={"v100": 500})
    result = simulate([b, a], policy="fcfs", config=config)
    outcome = {o.job.id: o for o in result.jobs}
    assert outcome[0].finish == 7_200 and outcome[0].jct == 7_200
    assert outcome[1].first_run == 3_600 and outcome[1].finish == 7_200 and outcome[1].jct == 7_100
    assert [r.allocated for r in result.rounds] == [
        {"v100": 1.0, "k80": 0.0},
        {"v100": 1.0, "k80": 1.0},
    ]
    # fcfs has no auction: each GPU-hour costs the reserve (500 on v100, 0 on k80).
    assert outcome[0].spend == 1_000 and outcome[1].spend == 0
    summary = summarise(result)
    # Round 0: 1 of 2 GPUs busy; round 1: both busy the whole hour.
    assert summary.utilisation == pytest.approx(0.75)
    assert summary.jct_mean_h == pytest.approx((7_200 + 7_100) / 2 / 3600)
    # Alone on half the cluster (one GPU of each type would be 0.5 GPU each) A runs at
    # 0.5 x 2 + 0.5 x 1 = 1.5 steps/s: 9 600 s; rho = 7200 / 9600.
    assert outcome[0].isolated == pytest.approx(9_600)
    assert outcome[0].rho == pytest.approx(0.75)
    assert summary.spend == {0: 1_000, 1: 0}


def test_a_job_finishing_mid_round_frees_nothing_before_the_next_round():
    a = job(0, steps=1_800, arrival=0, tenant=0, v100=1.0, k80=1.0)  # half a round
    b = job(1, steps=3_600, arrival=0, tenant=0, v100=1.0, k80=1.0)
    result = simulate([a, b], policy="fcfs", config=SimConfig(tiers={"v100": 1}, tenants=1))
    finish = {o.job.id: o.finish for o in result.jobs}
    assert finish == {0: 1_800, 1: 7_200}
    assert result.rounds[0].busy_gpu_seconds == 1_800


def test_helpers():
    j = job(0, steps=1, arrival=0, tenant=0, v100=6.0, k80=2.0, scale=4)
    assert limit_prices(j, {"v100": 1, "k80": 1}) == {"v100": 3_000, "k80": 1_000}
    # 4-GPU gang, 4 tenants on 8 v100 + 8 k80: 2 v100 + 2 k80 -> (2*6 + 2*2) / 4 steps/s.
    assert isolated_rate(j, {"v100": 8, "k80": 8}, 4) == pytest.approx(4.0)
    assert jain_index([1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0]) == 0.5
    assert jain_index([1.0]) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tiers": {}}, "at least one tier"),
        ({"tiers": {"v100": 0}}, "at least one GPU"),
        ({"tiers": {"v100": 1}, "round_minutes": 0}, "round length"),
        ({"tiers": {"v100": 1}, "max_rounds": 0}, "--rounds"),
    ],
)
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(SimulationError, match=message):
        simulate(
            [job(0, steps=1, arrival=0, tenant=0, v100=1, k80=1)],
            policy="fcfs",
            config=SimConfig(**kwargs),
        )


def test_unknown_policy_lists_the_choices():
    with pytest.raises(SimulationError, match="fcfs, fisher, maxmin, welfare"):
        simulate([], policy="lottery", config=SimConfig(tiers={"v100": 1}))


@pytest.fixture(scope="module")
def head_jobs():
    table = throughputs_load(DATA / "simulation_throughputs.json")
    return trace_load(
        DATA / "head40.trace",
        throughputs=table,
        gpu_types=list(TIERS),
        tenants=4,
        seed=3,
        max_jobs=12,
    )


@pytest.fixture(scope="module")
def head_results(head_jobs):
    config = SimConfig(tiers=TIERS, tenants=4, round_minutes=120)
    return {p: simulate(head_jobs, policy=p, config=config) for p in POLICIES}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_job_finishes_and_metrics_are_in_range(head_jobs, head_results, policy):
    result = head_results[policy]
    summary = summarise(result)
    assert summary.finished == summary.jobs == len(head_jobs)
    assert 0 < summary.utilisation <= 1 + 1e-9
    assert 0 < summary.jain <= 1 + 1e-9
    assert 0 <= summary.rho_over_share <= 1
    jcts = [o.jct / 3600 for o in result.jobs]
    assert min(jcts) - 1e-9 <= summary.jct_mean_h <= max(jcts) + 1e-9
    assert min(jcts) - 1e-9 <= summary.jct_p95_h <= max(jcts) + 1e-9
    for outcome in result.jobs:
        j = outcome.job
        # No policy beats the job alone on the whole cluster (its gang on its fastest types).
        fastest = isolated_rate(j, TIERS, 1)
        assert outcome.jct >= j.steps / fastest * (1 - 1e-9)
        assert outcome.first_run >= j.arrival
        assert outcome.rho > 0 and math.isfinite(outcome.rho)
    for record in result.rounds:
        for gpu_type, gpus in record.allocated.items():
            assert gpus <= TIERS[gpu_type] + 1e-6
    if policy != "fcfs":
        # A job never pays more than its limit: BASE_PRICE x its best speed-up per GPU-hour.
        for outcome in result.jobs:
            best = max(limit_prices(outcome.job, TIERS).values())
            gpu_hours = outcome.jct / 3600 * outcome.job.scale + 2 * outcome.job.scale
            assert outcome.spend <= best * gpu_hours


@pytest.mark.parametrize("policy", POLICIES)
def test_deterministic_with_a_seed(head_jobs, head_results, policy):
    again = simulate(
        head_jobs, policy=policy, config=SimConfig(tiers=TIERS, tenants=4, round_minutes=120)
    )
    assert [o.finish for o in again.jobs] == [o.finish for o in head_results[policy].jobs]
    assert [o.spend for o in again.jobs] == [o.spend for o in head_results[policy].jobs]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_work_conserving(head_jobs, head_results, policy):
    # In every round a GPU is left idle only if every waiting job already has its whole gang.
    result = head_results[policy]
    capacity = sum(TIERS.values())
    for record in result.rounds:
        used = sum(record.allocated.values())
        asked = sum(record.demand.values())
        assert used == pytest.approx(min(capacity, asked))


def test_max_rounds_stops_early_and_reports_unfinished(head_jobs):
    result = simulate(
        head_jobs, policy="fcfs", config=SimConfig(tiers=TIERS, tenants=4, max_rounds=2)
    )
    summary = summarise(result)
    assert summary.rounds == 2
    assert summary.finished < summary.jobs


def test_whole_gpus_refuse_a_gang_larger_than_the_cluster():
    big = job(0, steps=10, arrival=0, tenant=0, v100=1.0, k80=1.0, scale=8)
    config = SimConfig(tiers={"v100": 2, "k80": 2}, tenants=1, divisible=False)
    with pytest.raises(
        SimulationError, match="job 0 needs 8; with whole GPUs they could never run"
    ):
        simulate([big], policy="welfare", config=config)


def test_a_job_that_can_never_be_served_stops_the_simulation_with_a_reason():
    # A 2-GPU gang, whole GPUs, and a share cap of 1 GPU per tenant: it can never run.
    gang = job(0, steps=10, arrival=0, tenant=0, v100=1.0, k80=1.0, scale=2)
    config = SimConfig(tiers={"v100": 2}, tenants=1, divisible=False, max_share_pct={"v100": 50})
    with pytest.raises(
        SimulationError, match=r"1 job\(s\) can never be served under welfare, e.g. job 0"
    ):
        simulate([gang], policy="welfare", config=config)
