"""The pace endpoint on real telemetry: samples ingested through the telemetry service."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.api.world import telemetry_batch

pytestmark = pytest.mark.django_db

STEP = timedelta(seconds=10)


def feed(world, *, start, segments):
    """Batches every 10 s from ``start``: A's job on GPUs 0-1, B's on GPU 3, each segment
    (A's utilisation %, seconds)."""
    at = start
    a, b = world.a.allocation.pk, world.b.allocation.pk
    for utilization, seconds in segments:
        for _ in range(int(seconds // STEP.total_seconds())):
            telemetry_batch(
                node=world.node,
                at=at,
                gpus=6,
                utilization={0: utilization, 1: utilization, 3: 90},
                processes={0: a, 1: a, 3: b},
            )
            at += STEP
    return at


def pace(world, side=None):
    side = side or world.a
    response = side.client().get(f"/api/v1/allocations/{side.allocation.pk}/pace")
    assert response.status_code == 200, response.content
    return response.json()


def test_sustained_low_utilisation_is_heavy_and_a_spike_does_not_flip_it(world):
    start = timezone.now() - timedelta(minutes=8)
    end = feed(world, start=start, segments=[(20, 400)])
    reading = pace(world)
    assert reading["mode"] == "heavy", reading
    assert reading["numbers"]["gpus"] == 2
    assert reading["numbers"]["utilization_pct"] == 20.0
    assert reading["numbers"]["headroom_pct"] == 80.0
    assert any("spare" in r for r in reading["reasons"])

    # One saturated reading: still heavy, with the pending change reported.
    feed(world, start=end, segments=[(98, 10)])
    spiked = pace(world)
    assert spiked["mode"] == "heavy"
    assert spiked["numbers"]["pending_seconds"] == 0.0


def test_sustained_saturation_turns_light_after_the_dwell(world):
    start = timezone.now() - timedelta(minutes=8)
    end = feed(world, start=start, segments=[(20, 240), (97, 60)])
    assert pace(world)["mode"] == "heavy"  # 60 s of saturation: less than the 120 s dwell
    feed(world, start=end, segments=[(97, 90)])
    reading = pace(world)
    assert reading["mode"] == "light"
    assert reading["numbers"]["headroom_pct"] == 3.0


def test_each_allocation_reads_its_own_gpus(world):
    feed(world, start=timezone.now() - timedelta(minutes=6), segments=[(20, 300)])
    assert pace(world, world.a)["mode"] == "heavy"
    # B's job runs at 90 % on GPU 3: headroom 10 %, moderate (light only below 10 %).
    b = pace(world, world.b)
    assert b["mode"] == "moderate"
    assert b["numbers"]["utilization_pct"] == 90.0


def test_another_tenants_pace_is_404(world):
    response = world.b.client().get(f"/api/v1/allocations/{world.a.allocation.pk}/pace")
    assert response.status_code == 404
