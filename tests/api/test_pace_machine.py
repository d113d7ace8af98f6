"""The pace state machine on scripted utilisation series (pure: no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from telemetry.pace import (
    Mode,
    PaceConfig,
    Point,
    TierSpare,
    pace_decide,
    pace_replay,
    pace_target,
    points_from_samples,
)

T0 = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
CONFIG = PaceConfig()  # heavy >= 40 (stay >= 25), light < 10 (stay < 20), dwell 120 s
STEP = 10  # seconds between points


def series(*segments: tuple[float, int], start: datetime = T0) -> list[Point]:
    """Points every STEP seconds: each segment is (utilisation %, how many seconds)."""
    points, at = [], start
    for utilization, seconds in segments:
        for _ in range(seconds // STEP):
            points.append(Point(at=at, utilization_pct=utilization, memory_pct=20.0))
            at += timedelta(seconds=STEP)
    return points


def modes(points: list[Point], config: PaceConfig = CONFIG) -> list[Mode]:
    """The mode after each point."""
    return [pace_replay(points[: i + 1], config).mode for i in range(len(points))]


def test_a_single_spike_does_not_flip_the_mode():
    # Steady at 70 % utilisation (headroom 30 %: moderate), one reading at 2 % in the middle.
    points = series((70, 300), (2, 10), (70, 300))
    assert set(modes(points)) == {Mode.MODERATE}


def test_a_spike_shorter_than_the_dwell_does_not_flip_it_either():
    points = series((70, 300), (2, 110), (70, 300))
    assert set(modes(points)) == {Mode.MODERATE}


def test_a_sustained_shift_changes_the_mode_after_the_dwell():
    points = series((70, 300), (20, 300))  # headroom 30 % then 80 %
    state = pace_replay(points, CONFIG)
    assert state.mode == Mode.HEAVY
    shift = T0 + timedelta(seconds=300)
    # Exactly one switch, once the new target had held for the dwell time.
    assert state.switches == 1
    assert state.since == shift + timedelta(seconds=CONFIG.dwell_seconds)
    seen = modes(points)
    assert seen[: 30 + 12] == [Mode.MODERATE] * 42
    assert seen[42:] == [Mode.HEAVY] * (len(points) - 42)


def test_hysteresis_band_keeps_heavy_until_headroom_falls_below_the_exit_threshold():
    # Heavy at 20 % utilisation, then 72 % (headroom 28 %: below heavy_enter, above heavy_exit).
    points = series((20, 300), (72, 600))
    assert pace_replay(points, CONFIG).mode == Mode.HEAVY
    # From moderate the same 28 % headroom does not reach heavy.
    assert pace_target(Mode.MODERATE, 28.0, CONFIG) == Mode.MODERATE
    assert pace_target(Mode.HEAVY, 28.0, CONFIG) == Mode.HEAVY
    assert pace_target(Mode.HEAVY, 24.9, CONFIG) == Mode.MODERATE


def test_sustained_saturation_steps_down_to_light_and_recovers_only_past_light_exit():
    points = series((20, 300), (95, 300))  # heavy, then headroom 5 %
    assert pace_replay(points, CONFIG).mode == Mode.LIGHT
    # 85 % utilisation (headroom 15 %) is not enough to leave light: it stays below 20 %.
    assert (
        pace_replay(
            points + series((85, 600), start=points[-1].at + timedelta(seconds=STEP)), CONFIG
        ).mode
        == Mode.LIGHT
    )
    recovered = points + series((70, 300), start=points[-1].at + timedelta(seconds=STEP))
    assert pace_replay(recovered, CONFIG).mode == Mode.MODERATE


def test_flapping_faster_than_the_dwell_never_switches():
    points = series(*[(20, 60), (70, 60)] * 10)
    assert set(modes(points)) == {Mode.MODERATE}


def test_alternating_targets_away_from_the_current_mode_still_count_as_sustained():
    # From heavy, headroom alternates between 20 % (a moderate target) and 5 % (a light one):
    # the target keeps changing but never returns to heavy, so leaving heavy is sustained.
    points = series((20, 300), *[(80, 20), (95, 20)] * 5)
    state = pace_replay(points, CONFIG)
    assert state.mode != Mode.HEAVY


def test_a_gap_in_the_samples_breaks_a_run():
    before = series((70, 300), (20, 60))
    after = series((20, 70), start=before[-1].at + timedelta(seconds=300))
    # 60 s + 70 s of heavy-worthy samples, but five minutes apart: not a sustained shift.
    assert pace_replay(before + after, CONFIG).mode == Mode.MODERATE


def test_memory_pressure_alone_limits_headroom():
    point = Point(at=T0, utilization_pct=10.0, memory_pct=95.0)
    assert point.headroom_pct == pytest.approx(5.0)
    assert pace_target(Mode.MODERATE, point.headroom_pct, CONFIG) == Mode.LIGHT


def test_no_points_no_state():
    assert pace_replay([], CONFIG) is None


def test_points_from_samples_buckets_mean_utilisation_and_fullest_memory():
    rows = [
        {
            "at": T0 + timedelta(seconds=1),
            "utilization_pct": 40,
            "memory_used_mib": 10,
            "memory_total_mib": 100,
        },
        {
            "at": T0 + timedelta(seconds=2),
            "utilization_pct": 80,
            "memory_used_mib": 50,
            "memory_total_mib": 100,
        },
        {
            "at": T0 + timedelta(seconds=12),
            "utilization_pct": 10,
            "memory_used_mib": 0,
            "memory_total_mib": 0,
        },
    ]
    points = points_from_samples(rows, bucket_seconds=10)
    assert [p.at for p in points] == [T0, T0 + timedelta(seconds=10)]
    assert points[0].utilization_pct == 60
    assert points[0].memory_pct == 50
    assert points[1].memory_pct == 0  # a GPU reporting no memory total counts as empty


def tier(offered: int, allocated: int) -> TierSpare:
    return TierSpare(slug="a100", offered=offered, allocated=allocated)


def test_a_full_tier_holds_heavy_at_moderate_and_says_why():
    points = series((20, 600))
    reading = pace_decide(
        points=points, config=CONFIG, tier=tier(8, 8), running=True, gpus=2, samples=60
    )
    assert reading.mode == Mode.MODERATE
    assert any("held at moderate" in r for r in reading.reasons)
    roomy = pace_decide(
        points=points, config=CONFIG, tier=tier(8, 2), running=True, gpus=2, samples=60
    )
    assert roomy.mode == Mode.HEAVY
    assert roomy.numbers["tier_spare_gpus"] == 6
    assert roomy.numbers["headroom_pct"] == 80.0


def test_pending_change_is_reported_with_its_progress():
    points = series((70, 300), (20, 60))
    reading = pace_decide(
        points=points, config=CONFIG, tier=tier(8, 0), running=True, gpus=1, samples=36
    )
    assert reading.mode == Mode.MODERATE
    assert reading.numbers["pending_seconds"] == 50.0
    assert any("points to heavy" in r for r in reading.reasons)


def test_not_running_is_light_and_no_samples_is_moderate():
    stopped = pace_decide(
        points=series((20, 600)),
        config=CONFIG,
        tier=tier(8, 0),
        running=False,
        not_running_reason="allocation 3 is paused",
        gpus=1,
        samples=60,
    )
    assert stopped.mode == Mode.LIGHT
    assert stopped.reasons == ["allocation 3 is paused"]
    unknown = pace_decide(
        points=[], config=CONFIG, tier=tier(8, 0), running=True, gpus=0, samples=0
    )
    assert unknown.mode == Mode.MODERATE
    assert "no samples" in unknown.reasons[0]


@pytest.mark.parametrize(
    "overrides",
    [
        {"light_enter_pct": 30.0},  # above light_exit
        {"heavy_exit_pct": 50.0},  # above heavy_enter
        {"dwell_seconds": 600.0},  # history shorter than two dwells
        {"bucket_seconds": 0.0},
    ],
)
def test_inconsistent_thresholds_are_refused(overrides):
    with pytest.raises(ValueError):
        PaceConfig(**overrides)


def test_config_comes_from_settings_and_names_unknown_keys():
    with override_settings(GPUMARKET_PACE={"dwell_seconds": 30, "heavy_enter_pct": 50}):
        config = PaceConfig.from_settings()
    assert config.dwell_seconds == 30.0
    assert config.heavy_enter_pct == 50.0
    with (
        override_settings(GPUMARKET_PACE={"dwel_seconds": 30}),
        pytest.raises(ImproperlyConfigured, match="dwel_seconds"),
    ):
        PaceConfig.from_settings()
    with (
        override_settings(GPUMARKET_PACE={"light_enter_pct": 90}),
        pytest.raises(ImproperlyConfigured),
    ):
        PaceConfig.from_settings()
