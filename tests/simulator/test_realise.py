"""Realising a plan's time fractions as whole gangs, one GPU type a round."""

from __future__ import annotations

import pytest

from market.simulator import Job
from market.simulator.realise import Ledger, fluid_gpus, lease_rounds, place_gangs


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


def test_a_new_plan_does_not_move_a_gang_within_its_lease():
    # Two jobs with equal shares of one GPU; the second started last round. Without a restart
    # cost a new plan puts the job not yet run first; with one the leaseholder keeps its place.
    a, b = job(0), job(1)
    shares = {0: {"v100": 0.5}, 1: {"v100": 0.5}}
    ledger = Ledger()
    ledger.record({1: "v100"})
    ledger.new_plan({1: {"v100": 1.0}})
    assert place_gangs([a, b], shares, {"v100": 1}, ledger, running={1: "v100"}) == {0: "v100"}
    assert place_gangs(
        [a, b], shares, {"v100": 1}, ledger, running={1: "v100"}, restart_share=1 / 6, lease=17
    ) == {1: "v100"}


def test_the_lease_is_the_fewest_rounds_for_which_a_restart_costs_at_most_one_percent():
    assert lease_rounds(0, 360.0) == 1  # no restart cost, no lease
    assert lease_rounds(60, 360.0) == 17  # 60 s is 0.98 % of 17 six-minute rounds
    assert lease_rounds(60, 3600.0) == 2
    assert lease_rounds(36, 3600.0) == 1


def leased(jobs, plans, tiers, lease):
    """Realise ``plans`` (a list of (fractions, rounds)) with a lease; the placements."""
    ledger, history, running, old = Ledger(), [], {}, {}
    for fractions, rounds in plans:
        ledger.new_plan(old)
        for _ in range(rounds):
            placed = place_gangs(
                jobs, fractions, tiers, ledger, running=running, restart_share=1 / 6, lease=lease
            )
            ledger.record(placed)
            history.append(placed)
            running = placed
        old = fractions
    return history


def runs(history, job_id):
    """Each maximal run of consecutive rounds on one type: (type, first round, length)."""
    found, current = [], None
    for i, placed in enumerate([*history, {}]):
        gpu_type = placed.get(job_id)
        if current is not None and gpu_type != current[0]:
            found.append((current[0], current[1], i - current[1]))
            current = None
        if gpu_type is not None and current is None:
            current = (gpu_type, i)
    return found


def test_a_gang_is_not_moved_within_its_lease_while_the_plan_gives_it_a_share_there():
    jobs = [job(0), job(1, arrival=1.0), job(2, arrival=2.0)]
    fractions = {0: {"v100": 2 / 3}, 1: {"v100": 1 / 3, "k80": 1 / 3}, 2: {"k80": 2 / 3}}
    history = leased(jobs, [(fractions, 300)], {"v100": 1, "k80": 1}, lease=5)
    for j in jobs:
        cut_short = [r for r in runs(history, j.id) if r[1] + r[2] < 300 and r[2] < 5]
        assert not cut_short
    for job_id, targets in fractions.items():  # the plan's shares hold within two leases
        for gpu_type, target in targets.items():
            assert received(history, job_id, gpu_type) == pytest.approx(target, abs=10 / 300)


def test_a_new_plan_that_takes_the_type_away_ends_the_lease_at_once():
    a, b = job(0), job(1, arrival=1.0)
    plans = [({0: {"v100": 1.0}}, 1), ({0: {"k80": 1.0}, 1: {"v100": 1.0}}, 1)]
    history = leased([a, b], plans, {"v100": 1, "k80": 1}, lease=5)
    assert history == [{0: "v100", 1: "k80"}, {0: "k80", 1: "v100"}]


def test_with_a_lease_each_job_still_receives_its_planned_share_across_plans():
    # Plans that change every 7 rounds, shorter than the 17-round lease: what a job received
    # of each type stays within a lease of what the plans gave it, summed over plans (a job
    # that ran past its share under one plan is behind the others under the next).
    jobs = [job(0), job(1, arrival=1.0), job(2, arrival=2.0), job(3, arrival=3.0)]
    tiers = {"v100": 1, "k80": 1}
    first = {0: {"v100": 0.5}, 1: {"v100": 0.5}, 2: {"k80": 0.5}, 3: {"k80": 0.5}}
    second = {0: {"v100": 0.25}, 1: {"v100": 0.75}, 2: {"k80": 0.75}, 3: {"k80": 0.25}}
    plans = [(first, 7), (second, 7)] * 60
    history = leased(jobs, plans, tiers, lease=17)
    for j in jobs:
        for gpu_type in tiers:
            planned = sum(f[j.id].get(gpu_type, 0.0) * n for f, n in plans)
            got = sum(placed.get(j.id) == gpu_type for placed in history)
            assert abs(got - planned) <= 17, (j.id, gpu_type, got, planned)
    # Two GPUs for 840 rounds in runs of at least 17 rounds, but for the last ones.
    assert sum(len(runs(history, j.id)) for j in jobs) <= 2 * 840 / 17 + 4
