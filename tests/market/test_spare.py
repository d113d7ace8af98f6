"""The arithmetic of idle reclaim, backfill and failure refunds (market/spare.py), which the
platform's services and the simulator share. No database."""

from __future__ import annotations

import pytest

from market.spare import (
    IdlePolicy,
    backfill_charge,
    backfill_quantity,
    failure_refund,
    reclaim_refund,
    reclaim_time,
    subround_skip,
    subround_times,
)

POLICY = IdlePolicy(below_pct=5, idle_minutes=15, grace_minutes=5, refund_pct=50)
HOUR = 3600


def test_a_gpu_idle_to_the_windows_end_is_reclaimed_after_the_notice_and_grace():
    # Idle from minute 10: noticed at 25, reclaimed at 30.
    assert reclaim_time(idle_from=600, busy_again=None, window_end=HOUR, policy=POLICY) == 1800


def test_the_scan_sees_idleness_only_on_its_minute():
    # Idle from 10:30: the first scan with 15 idle minutes is at 26:00, the reclaim at 31:00.
    assert reclaim_time(idle_from=630, busy_again=None, window_end=HOUR, policy=POLICY) == 1860


def test_work_back_before_the_grace_runs_out_keeps_the_gpu():
    assert reclaim_time(idle_from=600, busy_again=1800, window_end=HOUR, policy=POLICY) is None
    assert reclaim_time(idle_from=600, busy_again=1801, window_end=HOUR, policy=POLICY) == 1800


def test_no_notice_when_the_grace_would_outlast_the_window():
    # Noticed at 55:00 the grace would end with the window: no notice. At 54:00 it ends first.
    assert reclaim_time(idle_from=2400, busy_again=None, window_end=HOUR, policy=POLICY) is None
    assert reclaim_time(idle_from=2340, busy_again=None, window_end=HOUR, policy=POLICY) == 3540
    assert not POLICY.may_notice(seconds_left=300) and POLICY.may_notice(seconds_left=301)


def test_a_reclaim_refunds_its_share_of_the_unused_time_never_more_than_is_left():
    # 2.000 credits per GPU-hour, half an hour unused, half refunded: 0.500 credits.
    assert reclaim_refund(price=2000, unused_seconds=1800, refund_pct=50, room=10**6) == 500
    assert reclaim_refund(price=2000, unused_seconds=1800, refund_pct=50, room=300) == 300
    assert reclaim_refund(price=2000, unused_seconds=1800, refund_pct=50, room=-5) == 0


def test_sub_rounds_run_every_interval_until_two_minutes_are_left():
    assert subround_times(window_seconds=HOUR, every_seconds=300) == [300.0 * k for k in range(12)]
    assert subround_times(window_seconds=700, every_seconds=300) == [0.0, 300.0]
    assert subround_skip(seconds_left=119, since_last=None, every_seconds=300)
    assert subround_skip(seconds_left=600, since_last=299, every_seconds=300)
    assert subround_skip(seconds_left=600, since_last=300, every_seconds=300) == ""


@pytest.mark.parametrize(
    ("gpus", "min_gpus", "left", "seconds", "expected"),
    [
        (4, 4, None, 600, 4),  # until cancelled: its gang
        (4, 1, 1200, 600, 2),  # elastic: what it still wants fills two GPUs
        (4, 3, 600, 600, 3),  # ...never below its minimum
        (4, 4, 600, 600, 4),  # a rigid gang asks for all of it
        (4, 1, 0, 600, None),  # done
    ],
)
def test_a_sub_round_bid_asks_for_the_work_the_order_still_wants(
    gpus, min_gpus, left, seconds, expected
):
    assert (
        backfill_quantity(gpus=gpus, min_gpus=min_gpus, gpu_seconds_left=left, seconds=seconds)
        == expected
    )


def test_an_award_pays_the_lesser_of_price_and_value_rounded_down():
    assert backfill_charge(gpus=3, price=2500, limit=2000, seconds=1799) == 3 * 2000 * 1799 // 3600
    assert backfill_charge(gpus=1, price=1500, limit=2000, seconds=3600) == 1500


def test_a_failure_refund_is_pro_rata_and_never_above_what_is_left():
    assert failure_refund(charge=60_000, lost=10, window=60, room=60_000) == 10_000
    assert failure_refund(charge=60_000, lost=10, window=60, room=4_000) == 4_000
    assert failure_refund(charge=60_000, lost=10, window=0, room=60_000) == 60_000
