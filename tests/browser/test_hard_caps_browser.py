"""In Chromium, what a person reads about a hard cap and a round: the left-out bid's reason
names the cap and the bid that took the room, a bid the cap cancelled says so, the admin
overview names the team the cap holds back, and the round's supply/demand chart draws the
bids the round cleared."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from market.models import Bid
from market.selectors import round_demand
from market.services.bids import bid_place, tenant_bids_cancel
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from tenants.budgets import budget_set
from tenants.ledger import MILLI
from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"
ADMIN_PASSWORD = "pw-admin-123"  # tests.factories.admin_user's
T0 = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)


@pytest.fixture
def capped_round(live_server):
    admin = factories.admin_user(username="ops")
    tier_create(actor=admin, slug="a100", name="A100", capacity=4)
    tier_create(actor=admin, slug="h100", name="H100", capacity=2)
    version = policy_version_create(
        actor=admin, mechanism="welfare", round_minutes=60,
        reserve_prices={"a100": 100, "h100": 200}, max_share_pct={"a100": 50},
    )  # fmt: skip
    policy_activate(version=version, actor=admin)
    language = factories.tenant(name="Language Group", credits=10 * MILLI)
    bea = factories.member(tenant=language, username="bea", password=PASSWORD)
    vision = factories.tenant(name="Vision Lab", credits=100 * MILLI)
    ada = factories.member(tenant=vision, username="ada", password=PASSWORD)
    budget_set(tenant=language, window="day", mode="hard", cap=400, actor=None)
    rnd = round_open_next(now=T0)

    def place(user, tenant, quantity, limits):
        return bid_place(user=user, tenant=tenant, round=rnd, quantity=quantity,
                         limits=limits, now=T0)  # fmt: skip

    took_room = place(bea, language, 1, {"a100": 300})
    left_out = place(bea, language, 1, {"a100": 200})
    place(ada, vision, 4, {"a100": 3000})  # its share cap lets it hold 2
    place(ada, vision, 2, {"a100": 1500, "h100": 2500})
    rnd = round_process(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
    return {"round": rnd, "took_room": took_room, "left_out": left_out, "language": language}


def test_a_left_out_bid_names_the_cap_and_the_bid_that_took_the_room(page, capped_round):
    took_room, left_out = capped_round["took_room"], capped_round["left_out"]
    login(page, "bea", PASSWORD)
    page.goto(f"/market/bids/{left_out.pk}/")
    assert page.inner_text("[data-testid=bid-reason]") == (
        "Won nothing: left out of the round because the daily hard cap of 0.400 credits has "
        f"0.400 left after 0.000 spent; the team's bid {took_room.pk} (up to 0.300) came first "
        "and holds 0.300 of it, leaving 0.100; this bid may cost up to 0.200, more than 0.100."
    )
    assert Bid.objects.get(pk=took_room.pk).status == "won"
    shot(page, "80-hard-cap-left-out-reason")


def test_a_bid_the_hard_cap_cancelled_says_so_in_the_list(page, capped_round):
    language = capped_round["language"]
    bea = language.memberships.get().user
    rnd = round_open_next(now=capped_round["round"].closes_at + timedelta(minutes=1))
    bid = bid_place(user=bea, tenant=language, round=rnd, quantity=1, limits={"a100": 300},
                    now=rnd.opens_at + timedelta(seconds=1))  # fmt: skip
    # What the enforcement loop does for a team at its hard cap.
    tenant_bids_cancel(tenant=language, reason="hard spend cap of 0.400 credits reached",
                       now=rnd.opens_at + timedelta(seconds=2))  # fmt: skip
    login(page, "bea", PASSWORD)
    page.goto("/market/bids/")
    row = page.locator("#bids tr", has=page.locator(f"a[href='/market/bids/{bid.pk}/']"))
    assert row.locator("td.reason").inner_text() == (
        "Cancelled: hard spend cap of 0.400 credits reached; the escrow went back to available."
    )
    shot(page, "81-hard-cap-cancelled-why")


def test_the_overview_names_the_held_back_team_and_the_chart_draws_the_cleared_bids(
    page, capped_round
):
    rnd = capped_round["round"]
    login(page, "ops", ADMIN_PASSWORD)
    page.goto("/")
    line = page.inner_text("[data-testid=blocked-team]")
    assert line.startswith(
        f"Language Group: a hard cap left 1 of its 2 bids out of round {rnd.pk} "
    )
    assert "they held 0.200 credits in escrow); day hard cap 0.400, spent" in line
    assert "No team is at a hard cap" not in page.inner_text("#capped-teams")
    shot(page, "82-overview-hard-capped-team")

    page.goto(reverse("staff_round_detail", args=[rnd.pk]))
    page.wait_for_function("document.getElementById('supply-demand-0').data !== undefined")
    expected = round_demand(rnd=rnd)
    for i, slug in enumerate(sorted(set(rnd.capacities) | set(expected))):
        trace = page.evaluate(
            f"(() => {{ const t = document.getElementById('supply-demand-{i}').data[0];"
            " return {x: Array.from(t.x), y: Array.from(t.y)}; })()"
        )
        # The demand steps: cumulative GPUs of the cleared bids, highest limit first.
        total, xs = 0.0, []
        for _price, quantity in sorted(expected.get(slug, []), key=lambda b: -b[0]):
            xs += [total, total + quantity]
            total += quantity
        assert trace["x"][: len(xs)] == xs, slug
        assert max(trace["x"]) == total
    # a100: Vision Lab's share cap lets it hold 2 (its two-tier bid adds nothing there), and
    # Language Group's admitted bid 1; the left-out bid is not drawn.
    assert sum(q for _, q in expected["a100"]) == 2 + 1
    assert expected["h100"] == [(2500, 1.0)]
    shot(page, "83-round-supply-demand-cleared-bids")
