"""The Python client and the pace example against a live server (real HTTP, real threads)."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpumarket.client import ApiError, Client, Pace
from tenants.ledger import balance_get
from tests.api.world import TIER, world_build, world_telemetry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "pace_training_loop.py"


@pytest.fixture
def live_world(transactional_db, live_server):
    world = world_build()
    world_telemetry(world)
    return world


def test_client_bids_reads_and_reports_refusals(live_world, live_server):
    world = live_world
    client = Client(live_server.url, world.a.token)
    assert client.me()["tenant"]["slug"] == world.a.tenant.slug
    start = client.balance()
    assert Decimal(start["available"]) * 1000 == balance_get(tenant=world.a.tenant).available

    rnd = client.open_round()
    assert rnd["id"] == world.open_round.pk
    assert [t["slug"] for t in client.tiers()] == [TIER]
    assert [r["id"] for r in client.rounds(status="settled")] == [world.past_round.pk]

    bid = client.place_bid(round=rnd["id"], quantity=2, limits={TIER: "1.2"}, idempotency_key="k-1")
    again = client.place_bid(
        round=rnd["id"], quantity=2, limits={TIER: Decimal("1.200")}, idempotency_key="k-1"
    )
    assert again["id"] == bid["id"]
    assert bid["limits"] == {TIER: "1.200"}
    escrow = Decimal(client.balance()["escrow"])
    assert escrow == Decimal(start["escrow"]) + Decimal(bid["escrow"]) > 0
    assert client.edit_bid(bid["id"], quantity=3)["quantity"] == 3
    assert client.cancel_bid(bid["id"])["status"] == "cancelled"
    assert client.balance() == start
    assert bid["id"] in {b["id"] for b in client.bids(status="cancelled")}

    with pytest.raises(ApiError) as refused:
        client.place_bid(round=rnd["id"], quantity=1_000, limits={TIER: "1000"})
    assert refused.value.status == 409
    assert refused.value.code == "refused"
    assert "insufficient credits" in refused.value.message

    with pytest.raises(ApiError) as invalid:
        client.place_bid(round=rnd["id"], quantity=0, limits={TIER: "1"})
    assert invalid.value.status == 400
    assert "quantity" in invalid.value.fields

    # An int was milli-credits before the API moved to credits: refused, never guessed.
    with pytest.raises(TypeError, match="credits as a string or Decimal"):
        client.place_bid(round=rnd["id"], quantity=1, limits={TIER: 1_200})

    with pytest.raises(ApiError) as foreign:
        client.cancel_bid(world.b.bid.pk)
    assert foreign.value.status == 404

    allocations = client.allocations(status="active")
    assert [a["id"] for a in allocations] == [world.a.allocation.pk]
    reading = client.pace_reading(allocations[0]["id"])
    assert reading["mode"] in ("light", "moderate", "heavy")


def test_pace_helper_polls_at_most_once_per_interval_and_survives_outages(live_world, live_server):
    world = live_world
    now = [0.0]
    client = Client(live_server.url, world.a.token)
    pace = Pace(client, world.a.allocation.pk, min_interval=30, clock=lambda: now[0])
    first = pace.mode()
    assert pace.reading is not None and pace.reading["mode"] == first
    asked = pace.reading
    now[0] = 29.0
    pace.mode()
    assert pace.reading is asked  # served from the cache
    now[0] = 30.0
    pace.mode()
    assert pace.reading is not asked

    # Unreachable server: the last mode stays, the error is kept for the loop to log.
    offline = Pace(Client("http://127.0.0.1:9", world.a.token, timeout=1), 1, min_interval=0)
    assert offline.mode() == "light"  # the fallback, before any answer
    assert offline.last_error.status == 0
    assert not offline.allows("moderate")
    assert offline.allows("light")
    with pytest.raises(ValueError):
        offline.allows("turbo")


def test_revoked_token_stops_the_client_at_once(live_world, live_server):
    from tenants.models import ApiToken
    from tenants.services.tokens import token_revoke

    world = live_world
    client = Client(live_server.url, world.a.token)
    assert client.balance()
    token = ApiToken.objects.get(user=world.a.user)
    token_revoke(user=world.a.user, token_id=token.pk)
    with pytest.raises(ApiError) as refused:
        client.balance()
    assert refused.value.status == 401


def test_pace_example_runs_against_the_live_server(live_world, live_server):
    world = live_world
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--url",
            live_server.url,
            "--token",
            world.a.token,
            "--steps",
            "3",
            "--step-seconds",
            "0",
            "--min-interval",
            "0",
        ],
        cwd=ROOT,
        # As after `pip install -e .` (the README's install): the gpumarket package importable.
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4
    assert all("mode=" in line and "seq_len=" in line for line in lines[:3])
    assert lines[-1].startswith(f"allocation {world.a.allocation.pk}: 3 steps")
