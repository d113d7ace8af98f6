"""Idle GPUs within a window (market/simulator/spare.py): busy and idle stretches, idle
reclaim and backfill sub-rounds, by the platform's rules (market/spare.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from market.simulator import Job, SimConfig, SimulationError, simulate, summarise
from market.simulator.spare import Holding, hold, holding_charge
from market.simulator.trace import throughputs_load, trace_load
from market.spare import IdlePolicy

DATA = Path(__file__).parent / "data"
POLICY = IdlePolicy(below_pct=5, idle_minutes=15, grace_minutes=5, refund_pct=50)
HOUR = 3600.0


def _hold(**kwargs) -> Holding:
    args = {
        "job": 0,
        "gpu_type": "v100",
        "gpus": 2,
        "start": 0.0,
        "window": HOUR,
        "utilisation": 1.0,
        "idle_stretch": "end",
        "need_seconds": 10 * HOUR,
        "lost_seconds": 0.0,
        "policy": POLICY,
    }
    return hold(**(args | kwargs))


def test_a_gang_done_with_its_gpus_for_the_window_is_reclaimed_after_notice_and_grace():
    # Half the window's work first, then idle from 30:00: noticed at 45:00, reclaimed at 50:00.
    h = _hold(utilisation=0.5)
    assert h.busy == ((0.0, 1800.0),) and h.progress_seconds == 1800.0
    assert h.reclaimed_at == 3000.0 and h.finish is None
    assert h.holds(2999, HOUR) and not h.holds(3000, HOUR)


def test_an_owner_who_comes_back_after_the_reclaim_loses_the_rest_of_the_window():
    # Busy 0-15:00 and 45:00-60:00; idle from 15:00, reclaimed at 35:00 before it returns.
    h = _hold(utilisation=0.5, idle_stretch="middle")
    assert h.reclaimed_at == 2100.0
    assert h.busy == ((0.0, 900.0),) and h.progress_seconds == 900.0


def test_a_short_idle_stretch_is_never_reclaimed():
    # 80 % busy in the middle model: idle 24:00-36:00, 12 minutes, less than the 15 minutes.
    h = _hold(utilisation=0.8, idle_stretch="middle")
    assert h.reclaimed_at is None and h.progress_seconds == pytest.approx(0.8 * HOUR)


def test_gpus_left_idle_after_the_work_ends_are_reclaimed_and_the_restart_is_busy_time():
    h = _hold(need_seconds=540.0, lost_seconds=60.0)
    assert h.finish == 600.0 and h.busy == ((0.0, 600.0),) and h.progress_seconds == 540.0
    assert h.reclaimed_at == 1800.0  # idle from 10:00, noticed at 25:00


def test_no_reclaim_without_a_policy():
    assert _hold(utilisation=0.5, policy=None).reclaimed_at is None


def test_a_reclaim_refunds_its_share_of_the_unused_time_and_a_backfill_pays_the_time_left():
    h = _hold(utilisation=0.5)  # reclaimed at 50:00 with 10 minutes left
    # Two GPUs held the hour at 1.200 credits: 2.400; refunded half of 10 minutes: 0.200.
    assert holding_charge(h, price=1200, window=HOUR, refund_pct=50) == 2400 - 2 * 100
    b = _hold(start=1800.0, backfill=True, utilisation=1.0)
    assert b.reclaimed_at is None
    assert holding_charge(b, price=1200, window=HOUR, refund_pct=50) == 1200


def _job(id: int, *, steps: int, utilisation: float | None = None) -> Job:
    return Job(
        id=id,
        job_type="test",
        scale=1,
        steps=steps,
        arrival=0.0,
        tenant=id,
        throughput={"v100": 1.0},
        utilisation=utilisation,
    )


def test_a_reclaimed_gpu_is_backfilled_by_a_waiting_job_within_the_window():
    # One GPU, two jobs that compute a quarter of the time they hold it. Without reclaim the
    # GPU computes 15 minutes of the first hour; with it the holder's GPU is reclaimed at
    # 35:00 (idle from 15:00) and the other job takes it at that sub-round and computes a
    # quarter of the 25 minutes left.
    jobs = [_job(0, steps=3600), _job(1, steps=3600)]
    base = SimConfig(tiers={"v100": 1}, tenants=2, utilisation=0.25)
    plain = simulate(jobs, policy="welfare", config=base)
    spare = simulate(
        jobs,
        policy="welfare",
        config=SimConfig(
            tiers={"v100": 1},
            tenants=2,
            utilisation=0.25,
            idle_reclaim=POLICY,
            backfill_minutes=5,
        ),
    )
    assert plain.rounds[0].busy_gpu_seconds == 900 and plain.rounds[0].backfill_gpus == 0
    first = spare.rounds[0]
    assert first.reclaimed_gpus == 1 and first.backfill_gpus == 1
    assert first.busy_gpu_seconds == 900 + 1500 / 4
    assert first.backfill_busy_gpu_seconds == 1500 / 4
    # The backfilled job is stopped when the window ends (preemptible terms).
    assert sum(o.preemptions for o in spare.jobs) >= 1
    assert summarise(spare).utilisation > summarise(plain).utilisation
    assert summarise(spare).jct_mean_h < summarise(plain).jct_mean_h


def test_without_idle_time_the_window_model_gives_the_round_models_finish_times():
    # A reclaim policy that never fires within an hour sends every round through the window
    # model; with no idle stretch it must agree with the round model exactly.
    tiers = {"k80": 4, "p100": 4, "v100": 4}
    jobs = trace_load(
        DATA / "head40.trace",
        throughputs=throughputs_load(DATA / "simulation_throughputs.json"),
        gpu_types=list(tiers),
        tenants=4,
    )
    never = IdlePolicy(below_pct=5, idle_minutes=1440, grace_minutes=0, refund_pct=50)
    plain = simulate(jobs, policy="maxmin", config=SimConfig(tiers=tiers, tenants=4))
    window = simulate(
        jobs, policy="maxmin", config=SimConfig(tiers=tiers, tenants=4, idle_reclaim=never)
    )
    assert [o.finish for o in window.jobs] == pytest.approx([o.finish for o in plain.jobs])
    assert [r.busy_gpu_seconds for r in window.rounds] == pytest.approx(
        [r.busy_gpu_seconds for r in plain.rounds]
    )
    assert [o.spend for o in window.jobs] == [o.spend for o in plain.jobs]


def test_a_traces_utilisation_field_is_read_and_a_bad_one_refused(tmp_path):
    table = throughputs_load(DATA / "simulation_throughputs.json")
    good = tmp_path / "u.trace"
    good.write_text("A3C\tcmd\t-n\t1\t100\t0.0\t1\t0.4\nA3C\tcmd\t-n\t1\t100\t0.0\t1\n")
    jobs = trace_load(good, throughputs=table, gpu_types=["v100"], tenants=1)
    assert [j.utilisation for j in jobs] == [0.4, None]
    bad = tmp_path / "bad.trace"
    bad.write_text("A3C\tcmd\t-n\t1\t100\t0.0\t1\t40\n")
    with pytest.raises(SimulationError, match=r"bad.trace:1: utilisation \(field 8\)"):
        trace_load(bad, throughputs=table, gpu_types=["v100"], tenants=1)


@pytest.mark.parametrize(
    ("policy", "changes", "message"),
    [
        ("fifo", {"backfill_minutes": 5}, "fifo is a baseline"),
        ("welfare", {"backfill_minutes": 0}, "backfill interval must be 1-60"),
        ("welfare", {"utilisation": 0.0}, r"utilisation must be in \(0, 1\]"),
        ("welfare", {"utilisation": 0.5, "job_model": "fluid"}, "gang job model"),
        ("welfare", {"idle_stretch": "start"}, "idle stretch must be one of"),
    ],
)
def test_bad_settings_are_refused_by_name(policy, changes, message):
    config = SimConfig(tiers={"v100": 1}, tenants=2, **changes)
    with pytest.raises(SimulationError, match=message):
        simulate([_job(0, steps=10), _job(1, steps=10)], policy=policy, config=config)
