"""Policy pages: staff only; editing makes a new version with an audit event; activate and
shadow; the shadow comparison and the replay of past rounds; voiding a round with a reason."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import AuditEvent
from market.models import PolicyVersion, Round
from market.services.bids import bid_place
from market.services.policy import policy_shadow_set, policy_version_create
from market.services.tick import rounds_tick
from tenants.ledger import ledger_verify
from tests import factories
from tests.market.marketkit import market_make

pytestmark = pytest.mark.django_db

Status = PolicyVersion.Status


@pytest.fixture
def market(db):
    return market_make()


@pytest.fixture
def staff(market) -> Client:
    client = Client()
    client.force_login(market.admin)
    return client


@pytest.fixture
def teams(db):
    return [
        (t, factories.member(tenant=t))
        for t in (factories.tenant(name=f"Lab {i}", credits=10_000_000) for i in range(2))
    ]


def settle_round(market, teams) -> Round:
    """Both teams bid for 3 of the 4 a100 GPUs; the round clears and settles."""
    rnd = Round.objects.get(status=Round.Status.OPEN)
    for (tenant, user), limit in zip(teams, (3_000, 5_000), strict=True):
        bid_place(
            user=user,
            tenant=tenant,
            round=rnd,
            quantity=3,
            limits={"a100": limit},
            now=rnd.opens_at,
        )
    rounds_tick(now=rnd.closes_at + timedelta(seconds=1))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SETTLED
    return rnd


def test_pages_are_for_staff_only(market, teams):
    anonymous = Client()
    response = anonymous.get("/market/policy/")
    assert response.status_code == 302 and "/login/" in response["Location"]
    researcher = Client()
    researcher.force_login(teams[0][1])
    for url in [
        "/market/policy/",
        f"/market/policy/v{market.policy.number}/edit/",
        "/market/policy/shadow/",
    ]:
        assert researcher.get(url).status_code == 403
    assert researcher.post(f"/market/policy/v{market.policy.number}/activate/").status_code == 403


def test_list_shows_which_version_is_active_and_which_is_shadow(market, staff):
    draft = policy_version_create(actor=market.admin, based_on=market.policy, mechanism="fisher")
    policy_shadow_set(version=draft, actor=market.admin)
    page = staff.get("/market/policy/").content.decode()
    assert f'href="/market/policy/v{market.policy.number}/"' in page
    assert '<span class="badge">active</span>' in page
    assert '<span class="badge">shadow</span>' in page
    assert "Fisher market" in page


def test_edit_form_has_the_reserve_fields_the_browser_tests_use(market, staff):
    page = staff.get(f"/market/policy/v{market.policy.number}/edit/").content.decode()
    assert 'name="reserve_a100"' in page and 'value="1"' in page  # 1000 milli = 1 credit
    assert "Reserve price for A100 (credits per GPU-hour)" in page
    assert "Reserve price for H100 (credits per GPU-hour)" in page
    assert ">Save as new version</button>" in page


def form_data(market, **overrides):
    data = {
        "mechanism": "welfare",
        "params": "",
        "round_minutes": 60,
        "lead_minutes": 0,
        "reserve_a100": "1",
        "reserve_h100": "2",
        "share_a100": "",
        "share_h100": "",
        "note": "",
    }
    data.update(overrides)
    return data


def test_editing_a_reserve_price_creates_a_new_version_and_an_audit_event(market, staff):
    base = market.policy
    response = staff.post(
        f"/market/policy/v{base.number}/edit/",
        form_data(market, reserve_a100="1.5", price_max_multiple=3, note="raise a100 reserve"),
    )
    new = PolicyVersion.objects.get(number=base.number + 1)
    assert response.status_code == 302 and response["Location"] == f"/market/policy/v{new.number}/"
    assert new.status == Status.DRAFT and new.parent == base
    assert new.reserve_prices == {"a100": 1500, "h100": 2000}
    assert new.guardrails == {"price_max_multiple": 3.0}
    base.refresh_from_db()
    assert base.reserve_prices == {"a100": 1000, "h100": 2000}  # never edited
    event = AuditEvent.objects.filter(action="policy.version_create").latest("seq")
    assert event.actor_id == market.admin.pk
    assert event.before["reserve_prices"]["a100"] == 1000
    assert event.after["reserve_prices"]["a100"] == 1500
    assert event.after["number"] == new.number
    detail = staff.get(response["Location"]).content.decode()
    assert "1.500" in detail and "price_max_multiple" not in detail  # no raw keys
    assert "<dt>Price guardrail: at most N x the trailing median</dt><dd>3.0</dd>" in detail


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"params": "{not json"}, "not valid JSON"),
        ({"params": "[1, 2]"}, "must be a JSON object"),
        ({"reserve_a100": -5}, "Enter an amount of zero or more"),
        ({"reserve_a100": "12,5"}, "Use a point for decimals"),
        ({"utilisation_min": 1.5}, "less than or equal to 1"),
        ({"share_a100": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_input_is_shown_on_the_form_and_nothing_is_created(market, staff, overrides, message):
    before = PolicyVersion.objects.count()
    response = staff.post(
        f"/market/policy/v{market.policy.number}/edit/", form_data(market, **overrides)
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    assert PolicyVersion.objects.count() == before


def test_activate_and_shadow_buttons(market, staff, settings):
    # One administrator activates when the two-person rule is off (tests/governance has it on).
    settings.GPUMARKET_APPROVALS = {}
    draft = policy_version_create(actor=market.admin, based_on=market.policy, mechanism="maxmin")
    assert staff.get(f"/market/policy/v{draft.number}/activate/").status_code == 405
    staff.post(f"/market/policy/v{draft.number}/shadow/")
    assert PolicyVersion.objects.get(pk=draft.pk).status == Status.SHADOW
    staff.post("/market/policy/shadow/clear/")
    assert PolicyVersion.objects.get(pk=draft.pk).status == Status.DRAFT
    asked = staff.post(f"/market/policy/v{draft.number}/activate/")
    assert asked.status_code == 200 and "Activate v" in asked.content.decode()
    assert PolicyVersion.objects.get(pk=draft.pk).status == Status.DRAFT  # not yet confirmed
    response = staff.post(
        f"/market/policy/v{draft.number}/activate/", {"confirm": "1"}, follow=True
    )
    assert PolicyVersion.objects.get(pk=draft.pk).status == Status.ACTIVE
    assert PolicyVersion.objects.get(pk=market.policy.pk).status == Status.RETIRED
    assert "active from the next round" in response.content.decode()
    # A retired version cannot come back as it is; the message says what to do instead.
    response = staff.post(
        f"/market/policy/v{market.policy.number}/activate/", {"confirm": "1"}, follow=True
    )
    assert "create a new version based on it" in response.content.decode()


def test_shadow_comparison_shows_both_outcomes_per_round_and_summed(market, staff, teams):
    shadow = policy_version_create(
        actor=market.admin, based_on=market.policy, reserve_prices={"a100": 4_000, "h100": 2_000}
    )
    policy_shadow_set(version=shadow, actor=market.admin)
    # The round open now was opened before the shadow was set; the clearing uses the current one.
    rnd = settle_round(market, teams)
    assert rnd.shadow_result and rnd.shadow_result["number"] == shadow.number
    page = staff.get("/market/policy/shadow/").content.decode()
    assert f"#{rnd.pk}" in page
    assert f"Active v{market.policy.number}" in page and f"(v{shadow.number})" in page
    assert 'id="comparison-totals"' in page and 'id="shadow-chart"' in page
    assert "vendor/plotly/plotly.min.js" in page and "cdn." not in page
    # Active: 4 GPUs sold; shadow: only the 5.000 bid clears its 4.000 reserve (3 GPUs at 4.000).
    rows = page.split('id="comparison-totals"')[1]
    assert "<td>4</td><td>3</td>" in rows.replace("\n", "")


def test_replay_of_past_rounds_under_a_candidate(market, staff, teams):
    settle_round(market, teams)
    candidate = policy_version_create(
        actor=market.admin, based_on=market.policy, reserve_prices={"a100": 10_000, "h100": 2_000}
    )
    page = staff.get(f"/market/policy/v{candidate.number}/replay/?rounds=5").content.decode()
    assert 'id="comparison-rounds"' in page and 'id="replay-chart"' in page
    # Under a reserve of 10.000 no bid clears: nothing is allocated, no revenue.
    totals = page.split('id="comparison-totals"')[1].split("</table>")[0].replace("\n", "")
    assert '<th scope="row">GPUs allocated</th><td>4</td><td>0</td>' in totals
    rows = page.split('id="comparison-rounds"')[1]
    assert f"<td>v{candidate.number} (replayed)</td>" in rows
    assert "(replayed) (v" not in rows
    # Nothing was written by the replay.
    assert PolicyVersion.objects.get(pk=candidate.pk).status == Status.DRAFT
    assert ledger_verify() == []


def test_simulate_command_replays_recorded_rounds(market, teams):
    settle_round(market, teams)
    out = StringIO()
    call_command("simulate", "--from-rounds", "3", "--policy", "welfare,fisher", stdout=out)
    text = out.getvalue()
    assert "welfare (v1's reserves) over the last 1 rounds" in text
    assert "fisher (v1's reserves)" in text
    assert "GPUs allocated:          4 -> 4" in text


def test_void_page_needs_a_reason_and_a_confirmation(market, staff, teams):
    rnd = settle_round(market, teams)
    url = f"/market/policy/rounds/{rnd.pk}/void/"
    page = staff.get(url).content.decode()
    assert "cannot be undone" in page and 'id="void-allocations"' in page
    response = staff.post(url, {"reason": "rack fault"})
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    assert Round.objects.get(pk=rnd.pk).status == Round.Status.SETTLED
    response = staff.post(url, {"reason": "rack fault", "confirm": "on"}, follow=True)
    assert Round.objects.get(pk=rnd.pk).status == Round.Status.VOIDED
    assert "charges refunded" in response.content.decode()
    # Voiding a voided round again explains itself instead of failing.
    again = staff.post(url, {"reason": "again", "confirm": "on"}, follow=True)
    assert f"Round {rnd.pk} was already voided: rack fault" in again.content.decode()
    assert AuditEvent.objects.filter(action="round.void").count() == 1
    assert ledger_verify() == []


def test_void_of_an_open_round_is_refused_on_the_form(market, staff):
    response = staff.post(
        f"/market/policy/rounds/{market.round.pk}/void/", {"reason": "x", "confirm": "on"}
    )
    assert response.status_code == 200
    assert "only a settled or finished round can be voided" in response.content.decode()


@pytest.mark.parametrize(
    ("url", "shown"),
    [("/market/policy/", "No versions yet."), ("/market/policy/new/", "No version exists yet")],
)
def test_policy_pages_on_a_fresh_platform_write_nothing(db, url, shown):
    """A GET never writes: the default version is made when the first round opens (or a
    first version is saved), not when an admin looks at a policy page."""
    client = Client()
    client.force_login(factories.admin_user())
    events = AuditEvent.objects.count()
    response = client.get(url)
    assert response.status_code == 200
    assert shown in response.content.decode()
    assert not PolicyVersion.objects.exists()
    assert AuditEvent.objects.count() == events
