"""The round loop: hand-checked cases, then every policy end to end on a small trace."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from market.simulator import (
    BASELINES,
    MARKET,
    Job,
    SimConfig,
    SimulationError,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)
from market.simulator.engine import fit_gangs
from market.simulator.policies import equal_share_rate, limit_prices

DATA = Path(__file__).parent / "data"
TIERS = {"k80": 4, "p100": 4, "v100": 4}
ALL = [*MARKET, *BASELINES]


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


def test_fifo_serves_in_arrival_order_and_charges_the_reserve_for_gpu_time_run():
    # One v100 and one k80. A (first) takes the v100 for two rounds; B arrives during round
    # 0 and starts at the next boundary on the k80, which it needs for half a round.
    a = job(0, steps=14_400, arrival=0, tenant=0, v100=2.0, k80=1.0)
    b = job(1, steps=1_800, arrival=100, tenant=1, v100=2.0, k80=1.0)
    config = SimConfig(tiers={"v100": 1, "k80": 1}, tenants=2, reserve={"v100": 500, "k80": 200})
    result = simulate([b, a], policy="fifo", config=config)
    outcome = {o.job.id: o for o in result.jobs}
    assert outcome[0].finish == 7_200
    assert outcome[1].first_run == 3_600 and outcome[1].finish == 5_400
    assert [r.placed for r in result.rounds] == [{0: "v100"}, {0: "v100", 1: "k80"}]
    # Charge = min(price, limit) x GPU-hours actually run: A 2 h at 500, B half an hour at 200.
    assert outcome[0].spend == 1_000 and outcome[1].spend == 100
    assert summarise(result).spend == {0: 1_000, 1: 100}


def test_a_gang_larger_than_every_type_runs_on_the_largest_with_the_same_work_per_gpu():
    big = job(0, steps=10, arrival=0, tenant=0, v100=8.0, k80=4.0, scale=8)
    (fitted,), shrunk = fit_gangs([big], {"v100": 2, "k80": 4})
    assert shrunk == 1 and fitted.scale == 4
    assert fitted.throughput == {"v100": 4.0, "k80": 2.0}


def test_limit_prices_and_equal_share():
    j = job(0, steps=1, arrival=0, tenant=0, v100=6.0, k80=2.0, scale=4)
    assert limit_prices(j, {"v100": 1, "k80": 1}) == {"v100": 3_000, "k80": 1_000}
    # 4-GPU gang, N = 4 on 8 v100 + 8 k80: 2 v100 + 2 k80, i.e. half its time on each.
    assert equal_share_rate(j, {"v100": 8, "k80": 8}, 4) == pytest.approx(4.0)
    # N = 1: the whole gang fits on the v100s, its fastest type.
    assert equal_share_rate(j, {"v100": 8, "k80": 8}, 1) == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tiers": {}}, "at least one tier"),
        ({"tiers": {"v100": 0}}, "at least one GPU"),
        ({"tiers": {"v100": 1}, "round_minutes": 0}, "round length"),
        ({"tiers": {"v100": 1}, "max_rounds": 0}, "--rounds"),
        ({"tiers": {"v100": 1}, "job_model": "quantum"}, "job model must be one of gang, fluid"),
        ({"tiers": {"v100": 1}, "tenants": 1}, "belongs to tenant 3"),
    ],
)
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(SimulationError, match=message):
        simulate(
            [job(0, steps=1, arrival=0, tenant=3, v100=1, k80=1)],
            policy="fifo",
            config=SimConfig(**{"tenants": 4, **kwargs}),
        )


def test_unknown_policy_lists_the_choices():
    with pytest.raises(SimulationError, match="fairshare, fcfs, fifo, fisher, ftf, gavel-maxmin"):
        simulate([], policy="lottery", config=SimConfig(tiers={"v100": 1}))


@pytest.fixture(scope="module")
def head_jobs():
    table = throughputs_load(DATA / "simulation_throughputs.json")
    return trace_load(
        DATA / "head40.trace",
        throughputs=table,
        gpu_types=list(TIERS),
        tenants="jobs",
        max_jobs=10,
    )


def config(jobs, model="gang"):
    return SimConfig(tiers=TIERS, tenants=len(jobs), round_minutes=120, job_model=model)


@pytest.fixture(scope="module")
def head_results(head_jobs):
    return {p: simulate(head_jobs, policy=p, config=config(head_jobs)) for p in ALL}


@pytest.mark.parametrize("policy", ALL)
def test_every_policy_runs_end_to_end_and_metrics_are_in_range(head_jobs, head_results, policy):
    result = head_results[policy]
    summary = summarise(result)
    assert summary.finished == summary.jobs == len(head_jobs)
    assert summary.tenants == len(head_jobs)
    assert 0 < summary.utilisation <= 1 + 1e-9
    assert 0 <= summary.rho_over_one <= 1
    jcts = [o.jct / 3600 for o in result.jobs]
    assert min(jcts) - 1e-9 <= summary.jct_mean_h <= summary.makespan_h + 1e-9
    for outcome in result.jobs:
        j = outcome.job
        # No policy beats the job alone on its fastest type.
        assert outcome.jct >= j.steps / max(j.throughput.values()) * (1 - 1e-9)
        assert outcome.first_run >= j.arrival
    if policy in MARKET:
        # A job never pays more than its limit: BASE_PRICE x its best speed-up per GPU-hour.
        for outcome in result.jobs:
            best = max(limit_prices(outcome.job, TIERS).values())
            assert outcome.spend <= best * outcome.jct / 3600 * outcome.job.scale + 1


@pytest.mark.parametrize("policy", ALL)
def test_gangs_run_whole_on_one_type_each_round(head_jobs, head_results, policy):
    scale = {o.job.id: o.job.scale for o in head_results[policy].jobs}
    for record in head_results[policy].rounds:
        for gpu_type, gpus in record.allocated.items():
            on_type = [j for j, t in record.placed.items() if t == gpu_type]
            assert gpus == sum(scale[j] for j in on_type) <= TIERS[gpu_type]


@pytest.mark.parametrize("policy", ALL)
def test_no_gpu_idles_while_a_waiting_gang_would_fit(head_jobs, head_results, policy):
    result = head_results[policy]
    scale = {o.job.id: o.job.scale for o in result.jobs}
    finish = {o.job.id: o.finish for o in result.jobs}
    arrival = {o.job.id: o.job.arrival for o in result.jobs}
    for record in result.rounds:
        free = {t: TIERS[t] - record.allocated[t] for t in TIERS}
        waiting = [
            j
            for j in scale
            if j not in record.placed and arrival[j] <= record.start and finish[j] > record.start
        ]
        assert not any(scale[j] <= max(free.values()) for j in waiting)


@pytest.mark.parametrize("policy", ["maxmin", "gavel-maxmin", "ftf"])
def test_fluid_model_runs_end_to_end(head_jobs, policy):
    result = simulate(head_jobs, policy=policy, config=config(head_jobs, "fluid"))
    summary = summarise(result)
    assert summary.finished == len(head_jobs)
    assert all(math.isfinite(o.jct) for o in result.jobs)


def test_deterministic(head_jobs, head_results):
    again = simulate(head_jobs, policy="gavel-maxmin", config=config(head_jobs))
    assert [o.finish for o in again.jobs] == [o.finish for o in head_results["gavel-maxmin"].jobs]


def test_max_rounds_stops_early_and_reports_unfinished(head_jobs):
    result = simulate(
        head_jobs,
        policy="fifo",
        config=SimConfig(tiers=TIERS, tenants=len(head_jobs), max_rounds=2),
    )
    summary = summarise(result)
    assert summary.rounds == 2
    assert summary.finished < summary.jobs
