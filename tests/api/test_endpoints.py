"""The endpoints a researcher and an admin use, through the same services as the web pages."""

from __future__ import annotations

import json
import re
import types
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from rest_framework import serializers
from rest_framework.test import APIClient

from audit.models import AuditEvent
from core import ratelimit
from market.api.serializers import MOST_PRICE_CREDITS, BidSerializer, PriceInputField
from market.models import Bid
from market.selectors import bids_with_limits
from market.services._common import MAX_PRICE
from tenants.api.money import credits_text
from tenants.budgets import budget_set
from tenants.ledger import MILLI, balance_get
from tenants.models import Budget, Transfer
from tenants.services.tokens import token_create
from tests.api.world import CREDITS, RESERVE, TIER

pytestmark = pytest.mark.django_db


def post(api: APIClient, url: str, body: dict, **headers):
    return api.post(url, data=json.dumps(body), content_type="application/json", **headers)


def patch(api: APIClient, url: str, body: dict):
    return api.patch(url, data=json.dumps(body), content_type="application/json")


def bid_body(world, **overrides) -> dict:
    return {"round": world.open_round.pk, "quantity": 2, "limits": {TIER: "1.5"}} | overrides


def milli(text: str) -> int:
    """An amount the API sent ("1.500") in milli-credits, exactly."""
    return int(Decimal(text) * MILLI)


def test_place_edit_cancel_moves_escrow_and_audits(world):
    api = world.a.client()
    tenant = world.a.tenant
    start = balance_get(tenant=tenant)
    hours = world.open_round.hours

    placed = post(api, "/api/v1/bids", bid_body(world))
    assert placed.status_code == 201, placed.content
    bid = placed.json()
    assert bid["limits"] == {TIER: "1.500"}
    assert bid["status"] == "open"
    assert milli(bid["escrow"]) == int(2 * 1_500 * hours)
    assert balance_get(tenant=tenant).available == start.available - milli(bid["escrow"])
    assert AuditEvent.objects.filter(action="bid.place", object_id=str(bid["id"])).exists()

    edited = patch(api, f"/api/v1/bids/{bid['id']}", {"quantity": 3, "limits": {TIER: "2"}})
    assert edited.status_code == 200, edited.content
    assert edited.json()["limits"] == {TIER: "2.000"}
    assert milli(edited.json()["escrow"]) == int(3 * 2_000 * hours)
    assert balance_get(tenant=tenant).available == start.available - milli(edited.json()["escrow"])

    cancelled = api.post(f"/api/v1/bids/{bid['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["escrow"] == "0.000"
    assert balance_get(tenant=tenant) == start

    again = api.post(f"/api/v1/bids/{bid['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "refused"
    assert "only an open bid" in again.json()["error"]["message"]


def test_idempotency_key_makes_a_retry_return_the_first_bid(world):
    api = world.a.client()
    first = post(api, "/api/v1/bids", bid_body(world), HTTP_IDEMPOTENCY_KEY="job-7-attempt")
    holds = Transfer.objects.filter(tenant=world.a.tenant, kind=Transfer.Kind.HOLD).count()
    retry = post(api, "/api/v1/bids", bid_body(world), HTTP_IDEMPOTENCY_KEY="job-7-attempt")
    assert first.status_code == retry.status_code == 201
    assert retry.json()["id"] == first.json()["id"]
    # Both answers are the bid as stored (their limits are not read back: what was asked for).
    stored = api.get(f"/api/v1/bids/{first.json()['id']}").json()
    assert first.json() == stored and retry.json() == stored
    assert Transfer.objects.filter(tenant=world.a.tenant, kind=Transfer.Kind.HOLD).count() == holds
    other = post(
        api, "/api/v1/bids", bid_body(world, quantity=3), HTTP_IDEMPOTENCY_KEY="job-7-attempt"
    )
    assert other.status_code == 409
    assert "other terms" in other.json()["error"]["message"]


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({"note": "another job"}, id="note"),
        pytest.param({"campaign": "world"}, id="campaign"),
    ],
)
def test_an_idempotency_key_replayed_with_another_campaign_or_note_is_a_409(world, changed):
    api = world.a.client()
    first = post(api, "/api/v1/bids", bid_body(world, note="job 7"), HTTP_IDEMPOTENCY_KEY="k-cn")
    assert first.status_code == 201, first.content
    if changed.get("campaign") == "world":
        changed = {"campaign": world.a.campaign.pk}
    replay = post(
        api, "/api/v1/bids", bid_body(world, note="job 7") | changed, HTTP_IDEMPOTENCY_KEY="k-cn"
    )
    assert replay.status_code == 409, replay.content
    assert "other terms" in replay.json()["error"]["message"]
    assert Bid.objects.filter(tenant=world.a.tenant, idempotency_key="k-cn").count() == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("quantity", "3"),
        ("quantity", 3.0),
        ("quantity", True),
        ("min_quantity", "0"),
        ("round", "ROUND"),
        ("campaign", "CAMPAIGN"),
    ],
)
def test_the_bids_api_takes_integers_as_json_integers_only(world, field, value):
    api = world.a.client()
    if value == "ROUND":
        value = str(world.open_round.pk)
    if value == "CAMPAIGN":
        value = str(world.a.campaign.pk)
    bids = Bid.objects.count()
    response = post(api, "/api/v1/bids", bid_body(world) | {field: value})
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert any(name.startswith(field) for name in fields), fields
    assert "whole number" in str(fields)
    assert Bid.objects.count() == bids


@pytest.mark.parametrize(
    "price",
    [
        1500,  # an int: milli-credits before the API moved to credits, so refused, not guessed
        1.5,
        "1,5",
        "1,500",
        "1e3",
        "1.2345",
        "0",
        "0.000",
        "-1",
        "+1.5",
        " 1.5",
        "01.5",
        "1.",
        ".5",
        "NaN",
        "Infinity",
        "1_000",
        "1000000.001",
        "99999999999999999999",
    ],
)
def test_a_limit_price_is_credits_written_as_a_string(world, price):
    api = world.a.client()
    bids = Bid.objects.count()
    response = post(api, "/api/v1/bids", bid_body(world, limits={TIER: price}))
    assert response.status_code == 400, response.content
    assert "credits as a string" in response.json()["error"]["fields"][f"limits.{TIER}"][0]
    assert Bid.objects.count() == bids


def test_limit_prices_in_credits_are_held_to_the_milli_credit(world):
    api = world.a.client()
    start = balance_get(tenant=world.a.tenant)
    placed = post(api, "/api/v1/bids", bid_body(world, quantity=1, limits={TIER: "0.001"}))
    assert placed.status_code == 201, placed.content
    assert placed.json()["limits"] == {TIER: "0.001"}
    assert Bid.objects.get(pk=placed.json()["id"]).limits.get().price == 1
    held = start.available - balance_get(tenant=world.a.tenant).available
    assert milli(placed.json()["escrow"]) == held > 0


def test_the_schema_states_exactly_the_prices_the_server_takes(world):
    """The pattern in the schema is the one the server applies, and its bounds are the
    market's: 0.001 credits up to MAX_PRICE milli-credits per GPU-hour."""
    schema = world.a.client().get("/api/schema/?format=json").json()
    limits = schema["components"]["schemas"]["BidCreate"]["properties"]["limits"]
    pattern = limits["additionalProperties"]["pattern"]
    field = PriceInputField()
    assert MOST_PRICE_CREDITS * MILLI == MAX_PRICE

    @given(st.integers(min_value=-5, max_value=MAX_PRICE + 5))
    def every_amount(amount):
        text = credits_text(amount)
        taken = re.search(pattern, text) is not None
        assert taken == (1 <= amount <= MAX_PRICE)
        if taken:
            assert field.to_internal_value(text) == amount
            assert field.to_internal_value(text.rstrip("0").rstrip(".")) == amount

    @given(st.text(alphabet="0123456789.,-+eE _\n", max_size=12))
    def every_string(text):
        taken = re.search(pattern, text) is not None
        try:
            value = field.to_internal_value(text)
        except Exception:
            assert not taken
        else:
            assert taken and 1 <= value <= MAX_PRICE
            assert value == Decimal(text.strip()) * MILLI

    every_amount()
    every_string()


def test_refusals_write_nothing_and_say_why(world):
    api = world.a.client()
    bids = Bid.objects.count()
    transfers = Transfer.objects.count()

    broke = post(api, "/api/v1/bids", bid_body(world, quantity=1_000, limits={TIER: "1000"}))
    assert broke.status_code == 409
    assert "insufficient credits" in broke.json()["error"]["message"]

    budget_set(
        tenant=world.a.tenant,
        window=Budget.Window.DAY,
        mode=Budget.Mode.SAFE,
        cap=1_000,
        actor=None,
    )
    capped = post(api, "/api/v1/bids", bid_body(world))
    assert capped.status_code == 409
    assert "budget would be exceeded" in capped.json()["error"]["message"]

    unknown = post(api, "/api/v1/bids", bid_body(world, limits={"h900": "1"}))
    assert unknown.status_code == 409
    assert "unknown tier h900" in unknown.json()["error"]["message"]

    not_a_slug = post(api, "/api/v1/bids", bid_body(world, limits={"A 100!": "1"}))
    assert not_a_slug.status_code == 409
    assert not_a_slug.json()["error"]["fields"] == {"limits": ["unknown tier A 100!"]}

    closed = post(api, "/api/v1/bids", bid_body(world, round=world.past_round.pk))
    assert closed.status_code == 409
    assert "closed" in closed.json()["error"]["message"]

    assert Bid.objects.count() == bids
    assert Transfer.objects.count() == transfers


def test_malformed_requests_get_field_messages(world):
    api = world.a.client()
    bad = post(
        api, "/api/v1/bids", {"round": world.open_round.pk, "quantity": 0, "limits": {TIER: "lots"}}
    )
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) == {"quantity", f"limits.{TIER}"}
    assert "quantity" in error["message"]

    empty = post(api, "/api/v1/bids", {"round": world.open_round.pk, "quantity": 1, "limits": {}})
    assert empty.status_code == 400
    assert "limits" in empty.json()["error"]["fields"]

    not_json = api.post("/api/v1/bids", data="{oops", content_type="application/json")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["code"] == "parse_error"

    form = api.post("/api/v1/bids", data={"round": 1})
    assert form.status_code == 415

    bad_filter = api.get("/api/v1/ledger?kind=gift&since=yesterday")
    assert bad_filter.status_code == 400
    assert set(bad_filter.json()["error"]["fields"]) == {"kind", "since"}


def test_references_to_missing_or_foreign_objects_are_404_with_the_field(world):
    api = world.b.client()
    no_round = post(api, "/api/v1/bids", bid_body(world, round=999_999))
    assert no_round.status_code == 404
    assert no_round.json()["error"]["fields"] == {"round": ["no such round"]}
    foreign = post(api, "/api/v1/bids", bid_body(world, campaign=world.a.campaign.pk))
    assert foreign.status_code == 404
    assert foreign.json()["error"]["fields"] == {"campaign": ["no such campaign"]}
    own = post(api, "/api/v1/bids", bid_body(world, campaign=world.b.campaign.pk))
    assert own.status_code == 201
    assert own.json()["campaign"] == world.b.campaign.pk


def test_bid_rate_limit_is_per_token_and_says_when_to_retry(world, settings):
    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": {"bids": "2/minute", "pace": "100/minute"}
    }
    api = world.a.client()
    for _ in range(2):
        assert post(api, "/api/v1/bids", bid_body(world, quantity=1)).status_code == 201
    limited = post(api, "/api/v1/bids", bid_body(world, quantity=1))
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "throttled"
    assert 0 < int(limited["Retry-After"]) <= 60
    # Reads are not throttled, and the user's other token has its own allowance.
    assert api.get("/api/v1/bids").status_code == 200
    second = APIClient()
    second.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token_create(user=world.a.user, name='second').secret}"
    )
    assert post(second, "/api/v1/bids", bid_body(world, quantity=1)).status_code == 201


def test_bid_rate_limit_on_redis_counts_each_clock_minute_apart(
    world, settings, redis_url, monkeypatch
):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": "bid-rate-test",
        }
    }
    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": {"bids": "2/minute", "pace": "100/minute"}
    }
    cache.clear()
    api = world.a.client()
    monkeypatch.setattr(ratelimit, "time", types.SimpleNamespace(time=lambda: 6_000_057.0))
    for _ in range(2):
        assert post(api, "/api/v1/bids", bid_body(world, quantity=1)).status_code == 201
    limited = post(api, "/api/v1/bids", bid_body(world, quantity=1))
    assert limited.status_code == 429
    assert limited["Retry-After"] == "3"
    assert limited.json()["error"]["message"] == (
        "Request was throttled. Expected available in 3 seconds."
    )
    monkeypatch.setattr(ratelimit, "time", types.SimpleNamespace(time=lambda: 6_000_060.0))
    assert post(api, "/api/v1/bids", bid_body(world, quantity=1)).status_code == 201
    cache.clear()


def test_a_bid_reads_as_its_serializer_fields_would_show_it(world):
    placed = post(
        world.a.client(),
        "/api/v1/bids",
        bid_body(world, note="with a campaign", campaign=world.a.campaign.pk),
    )
    assert placed.status_code == 201, placed.content
    bids = list(bids_with_limits())
    assert {bid.status for bid in bids} >= {"open", "won"}
    assert any(bid.campaign_id for bid in bids) and any(bid.outcome for bid in bids)
    for bid in bids:
        limits = {limit.tier.slug: limit.price for limit in bid.limits.all()}
        for context in ({}, {"placed_limits": limits}):
            answer = BidSerializer(bid, context=context)
            by_fields = serializers.ModelSerializer.to_representation(answer, bid)
            assert answer.data == by_fields
            assert list(answer.data) == list(by_fields)


def test_rounds_tiers_balance_and_ledger(world):
    api = world.a.client()
    open_rounds = api.get("/api/v1/rounds/open").json()
    assert [r["id"] for r in open_rounds] == [world.open_round.pk]
    history = api.get("/api/v1/rounds?status=settled").json()["results"]
    assert [r["id"] for r in history] == [world.past_round.pk]
    assert milli(history[0]["prices"][TIER]) >= RESERVE

    tiers = api.get("/api/v1/tiers").json()["results"]
    assert [(t["slug"], t["reserve_price"]) for t in tiers] == [(TIER, credits_text(RESERVE))]
    assert api.get(f"/api/v1/tiers/{TIER}").json()["slug"] == TIER

    balance = api.get("/api/v1/balance").json()
    live = balance_get(tenant=world.a.tenant)
    assert balance == {
        "available": credits_text(live.available),
        "escrow": credits_text(live.escrow),
        "total": credits_text(live.total),
    }

    ledger = api.get("/api/v1/ledger").json()
    assert ledger["count"] == Transfer.objects.filter(tenant=world.a.tenant).count()
    grant = api.get("/api/v1/ledger?kind=grant").json()["results"]
    assert [(g["amount"], g["available_change"], g["escrow_change"]) for g in grant] == [
        (credits_text(CREDITS), credits_text(CREDITS), "0.000")
    ]
    charges = api.get("/api/v1/ledger?kind=charge").json()["results"]
    assert charges and all(
        c["escrow_change"] == f"-{c['amount']}" and c["available_change"] == "0.000"
        for c in charges
    )

    budgets = api.get("/api/v1/budgets").json()["results"]
    assert milli(budgets[0]["spent"]) == sum(milli(c["amount"]) for c in charges)
    assert api.get("/api/v1/notifications?unread=true").json()["count"] >= 1


def test_audit_is_for_admins_only(world):
    researcher = world.a.client().get("/api/v1/audit")
    assert researcher.status_code == 403
    admin = APIClient()
    admin.credentials(HTTP_AUTHORIZATION=f"Bearer {world.admin_token}")
    events = admin.get("/api/v1/audit?action=bid.place").json()
    assert events["count"] == Bid.objects.count()
    assert all(e["action"] == "bid.place" for e in events["results"])
    verify = admin.get("/api/v1/audit/verify").json()
    assert verify["ok"] is True
    assert verify["checked"] == AuditEvent.objects.count()
    # An admin who is in no tenant has no tenant data.
    assert admin.get("/api/v1/bids").status_code == 403


def test_unknown_api_paths_are_json_404s(world):
    api = world.a.client()
    response = api.get("/api/v1/bids/")
    assert response.status_code == 404
    assert "no trailing slash" in response.json()["error"]["message"]
    assert api.get("/api/v2/anything").json()["error"]["code"] == "not_found"


def test_schema_and_docs_are_served_without_external_scripts(client):
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/allocations/{id}/pace" in paths
    assert set(paths["/api/v1/telemetry/ingest"]["post"]["responses"]) >= {
        "200",
        "400",
        "401",
        "413",
    }
    assert set(paths["/api/v1/bids"]["post"]["responses"]) == {
        "201",
        "400",
        "401",
        "403",
        "404",
        "409",
        "415",
        "429",
    }
    for page in ("/api/docs/", "/api/redoc/"):
        html = client.get(page).content.decode()
        assert "cdn" not in html.lower()
        assert "/static/drf_spectacular_sidecar/" in html


@override_settings(DEBUG=False)
def test_errors_never_carry_html(world):
    api = world.a.client()
    response = api.get("/api/v1/allocations/abc")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"


def test_placing_a_bid_answers_what_was_stored_in_a_pinned_number_of_statements(
    world, django_assert_max_num_queries
):
    api = world.a.client()
    post(api, "/api/v1/bids", bid_body(world))  # the token's first use is recorded once
    # The token and bid_place (its 12 statements, one more to sum what the tenant's one
    # budget has used, the savepoint pair in a test). The round is read once, share-locked,
    # by bid_place, and the answer's limits are those it stored, not read back.
    with django_assert_max_num_queries(16):
        placed = post(api, "/api/v1/bids", bid_body(world, note="pinned"))
    assert placed.status_code == 201, placed.content
    assert api.get(f"/api/v1/bids/{placed.json()['id']}").json() == placed.json()


def test_bids_are_placed_while_the_rate_limit_cache_is_down(world, settings, caplog):
    from tests.conftest import free_port

    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        }
    }
    api = world.a.client()
    response = post(api, "/api/v1/bids", bid_body(world, quantity=1))
    assert response.status_code == 201, response.content
    assert "rate limit bids not counted" in caplog.text


@pytest.mark.parametrize("round_id", [2**63, 2**63 + 1, 10**30])
def test_a_bid_for_a_round_id_beyond_the_database_integers_is_a_400(world, round_id):
    before = Bid.objects.count()
    response = post(world.a.client(), "/api/v1/bids", bid_body(world, round=round_id))
    assert response.status_code == 400, response.content
    assert "round" in json.dumps(response.json())
    assert Bid.objects.count() == before


@pytest.mark.parametrize("slug", ["%00", "a%00b", "%ff"])
def test_a_tier_slug_with_a_nul_or_bad_bytes_is_a_404(world, slug):
    response = world.a.client().get(f"/api/v1/tiers/{slug}")
    assert response.status_code == 404
