"""Realising a plan's time fractions as whole gangs, one GPU type a round."""

from __future__ import annotations

import pytest

from market.simulator import Job
from market.simulator.realise import Ledger, fluid_gpus, place_gangs


def job(id: int, *, scale: int = 1, arrival: float = 0.0) -> Job:
    return Job(
        id=id,
        job_type="test",
        scale=scale,
        steps=1,
        arrival=arrival,
        tenant=id,
        throughput={"v100": 3.0, "k80": 1.0},
    )


def realise(jobs, fractions, tiers, rounds, ledger=None):
    ledger = ledger or Ledger()
    history = []
    for _ in range(rounds):
        placed = place_gangs(jobs, fractions, tiers, ledger)
        ledger.record(placed)
        history.append(placed)
    return history


def received(history, job_id, gpu_type):
    return sum(placed.get(job_id) == gpu_type for placed in history) / len(history)


def test_over_many_rounds_each_job_receives_its_target_fractions():
    # Three jobs, one v100 and one k80, a plan that uses both fully.
    jobs = [job(0), job(1, arrival=1.0), job(2, arrival=2.0)]
    fractions = {0: {"v100": 2 / 3}, 1: {"v100": 1 / 3, "k80": 1 / 3}, 2: {"k80": 2 / 3}}
    history = realise(jobs, fractions, {"v100": 1, "k80": 1}, rounds=300)
    for job_id, targets in fractions.items():
        for gpu_type, target in targets.items():
            assert received(history, job_id, gpu_type) == pytest.approx(target, abs=0.01)


def test_a_gang_runs_whole_on_one_type_or_not_at_all():
    # A 2-GPU gang with half its time on each type, but each type has only 1 GPU free once
    # the 1-GPU jobs are placed: it must never run as 1 v100 + 1 k80.
    gang = job(0, scale=2)
    small = [job(1, arrival=1.0), job(2, arrival=2.0)]
    tiers = {"v100": 2, "k80": 2}
    fractions = {0: {"v100": 0.5, "k80": 0.5}, 1: {"v100": 0.5}, 2: {"k80": 0.5}}
    for placed in realise([gang, *small], fractions, tiers, rounds=50):
        used = {t: sum(j.scale for j in [gang, *small] if placed.get(j.id) == t) for t in tiers}
        assert all(used[t] <= tiers[t] for t in tiers)
    assert received(realise([gang, *small], fractions, tiers, 100), 0, "v100") > 0.3


def test_idle_gpus_go_to_jobs_without_a_target():
    jobs = [job(0), job(1, arrival=1.0)]
    placed = place_gangs(jobs, {0: {"v100": 1.0}}, {"v100": 1, "k80": 1}, Ledger())
    assert placed == {0: "v100", 1: "k80"}


def test_a_deficit_is_carried_into_the_next_plan():
    ledger = Ledger()
    jobs = [job(0), job(1, arrival=1.0)]
    fractions = {0: {"v100": 0.5}, 1: {"v100": 0.5}}
    history = realise(jobs, fractions, {"v100": 1}, rounds=3, ledger=ledger)
    behind = 0 if received(history, 0, "v100") < 0.5 else 1
    ledger.new_plan(fractions)
    # Under the new plan both start even, so the job that was behind goes first.
    assert place_gangs(jobs, fractions, {"v100": 1}, ledger) == {behind: "v100"}


def test_fluid_model_holds_fractions_of_every_type_at_once():
    gpus = fluid_gpus([job(0, scale=4)], {0: {"v100": 0.5, "k80": 0.25}}, {"v100": 8, "k80": 8})
    assert gpus == {0: {"v100": 2.0, "k80": 1.0}}


def test_with_a_restart_cost_free_gpus_go_first_to_the_gang_that_ran_there():
    older, incumbent = job(0, arrival=0.0), job(1, arrival=10.0)
    # No shares: both wait for leftover GPUs; the older job would be first, but the job
    # that ran on the v100 last round keeps it when moving it would cost a restart.
    free_for_all = place_gangs([older, incumbent], {}, {"v100": 1}, Ledger(), running={1: "v100"})
    assert free_for_all == {0: "v100"}
    kept = place_gangs(
        [older, incumbent], {}, {"v100": 1}, Ledger(), running={1: "v100"}, restart_share=1 / 6
    )
    assert kept == {1: "v100"}


def test_with_a_restart_cost_a_new_plan_does_not_move_every_gang_at_once():
    # Two jobs with equal shares of one GPU; the second ran last round. Without a restart cost
    # a new plan puts the job not yet run first; with one the incumbent keeps its place.
    a, b = job(0), job(1)
    shares = {0: {"v100": 0.5}, 1: {"v100": 0.5}}
    ledger = Ledger()
    ledger.new_plan({})
    assert place_gangs([a, b], shares, {"v100": 1}, ledger, running={1: "v100"}) == {0: "v100"}
    assert place_gangs(
        [a, b], shares, {"v100": 1}, ledger, running={1: "v100"}, restart_share=1 / 6
    ) == {1: "v100"}
