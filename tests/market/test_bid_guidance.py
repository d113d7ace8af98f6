"""The bid form guides: beside each tier the GPUs offered, the reserve, the last price and the
share cap; before placing, warnings for a limit below the reserve, more GPUs than offered, a
gang that cannot fit, a share cap, and a soft budget the bid could pass; the escrow preview
on edit too."""

from __future__ import annotations

import pytest
from django.urls import reverse

from market.bid_guidance import TierGuide, bid_warnings
from market.services.bids import bid_place
from tenants.budgets import budget_set
from tenants.ledger import MILLI
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db

GUIDES = {
    "a100": TierGuide("a100", "A100", 4, 1000, 2500, 50, 2),
    "h100": TierGuide("h100", "H100", 2, 2000, None, 100, 2),
}


@pytest.mark.parametrize(
    ("bid", "words"),
    [
        ({"limits": {"a100": 500}}, "below its reserve (1.000)"),
        ({"quantity": 9, "limits": {"a100": 3000, "h100": 3000}}, "offer 6 in all"),
        ({"quantity": 3, "min_quantity": 3, "limits": {"h100": 3000}}, "cannot win"),
        ({"quantity": 3, "limits": {"a100": 3000}}, "at most 2 GPUs"),
    ],
)
def test_each_warning(bid, words):
    terms = {"quantity": 1, "min_quantity": 0} | bid
    warnings = bid_warnings(guides=GUIDES, **terms)
    assert any(words in w for w in warnings), warnings


def test_a_sound_bid_gets_no_warning_and_a_soft_budget_it_could_pass_does():
    sound = {"quantity": 2, "min_quantity": 0, "limits": {"a100": 3000}}
    assert bid_warnings(guides=GUIDES, **sound) == []
    over = bid_warnings(guides=GUIDES, soft_budgets=[("daily", -1500)], **sound)
    assert over == [
        "This bid could take your daily soft budget 1.500 credits over its cap: you will get "
        "alerts; the bid is not refused."
    ]


def test_the_form_shows_each_tiers_facts_and_the_preview_warns(client):
    market = market_make(max_share_pct={"a100": 50})
    team = factories.tenant(credits=1_000 * MILLI)
    user = factories.member(tenant=team)
    budget_set(tenant=team, window="day", mode="soft", cap=1 * MILLI, actor=None)
    client.force_login(user)
    page = client.get(reverse("bid_new")).content.decode()
    row = page.split('data-tier="a100"')[1].split("</tr>")[0]
    assert "<td>4</td>" in row and "1.000" in row and "50 % = 2 GPUs" in row
    assert "no round yet" in row
    preview = client.post(
        reverse("bid_preview"),
        {"round": market.round.pk, "idempotency_key": "k", "quantity": "5", "min_quantity": "0",
         "limit_a100": "0.5", "limit_h100": "3"},
    ).content.decode()  # fmt: skip
    assert "below its reserve (1.000)" in preview
    assert "offer 2 in all" in preview  # a100 is below reserve; h100 offers 2
    assert "daily soft budget" in preview


def test_the_edit_page_shows_the_escrow_preview_too(client):
    market = market_make()
    team = factories.tenant(credits=1_000 * MILLI)
    user = factories.member(tenant=team)
    bid = bid_place(
        user=user, tenant=team, round=market.round, quantity=2, limits={"a100": 3000}, now=T0
    )
    client.force_login(user)
    page = client.get(reverse("bid_edit", args=[bid.pk])).content.decode()
    assert 'data-testid="escrow-now"' in page and 'data-testid="escrow-preview"' in page
    assert 'hx-post="/market/bids/preview/"' in page
