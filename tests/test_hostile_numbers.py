"""Every staff and team form, given hostile numbers, answers with an error on the page and
never a 5xx, and writes nothing.

The forms are found from the templates: every `<form method="post">` a page renders must be
covered below or named as holding no number, so a new form cannot slip past this walk.
"""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Bid, PolicyVersion, Tier
from market.services import bid_place
from tenants.models import Membership
from tests import factories
from tests.market.marketkit import market_make

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
HOSTILE = ["1e30", "1e5000", "9" * 5000, "12,5", "-1", "NaN", "inf", "0x10", "1" + "0" * 30]


class _Form(HTMLParser):
    """The fields of the first POST form on a page, with their current values."""

    def __init__(self, want_action: str | None = None) -> None:
        super().__init__()
        self.want_action = want_action
        self.fields: dict[str, str] = {}
        self.numeric: set[str] = set()
        self._in_form = False
        self._done = False
        self._select: str | None = None
        self.action = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self._done:
            return
        if (
            tag == "form"
            and (a.get("method") or "").lower() == "post"
            and "logout" not in (a.get("action") or "")
            and (self.want_action is None or a.get("action") == self.want_action)
        ):
            self._in_form = True
            self.action = a.get("action") or ""
        if not self._in_form:
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "checkbox"):
            self.fields[name] = a.get("value") or ""
            if a.get("type") == "number" or a.get("inputmode") in ("decimal", "numeric"):
                self.numeric.add(name)
        elif tag == "input" and name and a.get("type") == "checkbox" and "checked" in a:
            self.fields[name] = a.get("value") or "on"
        elif tag == "select" and name:
            self._select = name
            self.fields.setdefault(name, "")
        elif tag == "option" and self._select:
            if "selected" in a or not self.fields[self._select]:
                self.fields[self._select] = a.get("value") or ""
        elif tag == "textarea" and name:
            self.fields[name] = ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        if tag == "form" and self._in_form:
            self._in_form, self._done = False, True


def _form(client, url: str, action: str | None = None) -> _Form:
    page = client.get(url)
    assert page.status_code == 200, (url, page.status_code)
    parser = _Form(action)
    parser.feed(page.content.decode())
    return parser


@pytest.fixture
def world(client):
    market = market_make()
    tenant = factories.tenant(name="Vision", credits=1_000_000)
    manager = factories.member(tenant=tenant, role=Membership.Role.MANAGER)
    bid = bid_place(
        user=manager, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000},
        now=timezone.now() - timedelta(seconds=1) if market.round.opens_at <= timezone.now()
        else market.round.opens_at,
    )  # fmt: skip
    admin = factories.admin_user()
    return {
        "tenant": tenant,
        "manager": manager,
        "admin": admin,
        "bid": bid,
        "tier": Tier.objects.get(slug="a100"),
        "policy": PolicyVersion.objects.get(),
    }


# (page with the form, who, numeric fields beyond the inputs marked numeric, where it posts)
def _targets(world) -> list[tuple]:
    return [
        (reverse("bid_new"), "manager", {"quantity", "min_quantity"}),
        (reverse("bid_new"), "manager", {"quantity", "min_quantity"}, reverse("bid_preview")),
        (reverse("bid_edit", args=[world["bid"].pk]), "manager", {"quantity", "min_quantity"}),
        (reverse("team_campaigns"), "manager", set(), reverse("team_budget_set")),
        (reverse("staff_credits"), "admin", set()),
        (reverse("staff_budgets"), "admin", set()),
        (reverse("staff_tenants"), "admin", {"weight"}),
        (reverse("staff_tiers"), "admin", {"capacity", "maintenance_gpus"}),
        (reverse("policy_new"), "admin", set()),
        (f"/admin/tenants/tenant/{world['tenant'].pk}/grant/", "admin", {"amount"}),
        (reverse("planned_campaigns"), "manager", {"gpu_hours", "priority"}),
    ]


# Forms a page renders that hold no number, with where they are checked instead.
NO_NUMBER = {
    "gpu_maintenance",  # on/off, tests/telemetry/test_views.py
    "audit_verify",
    "team_member_role",
    "team_member_remove",
    "notifications_read",
    "api_token_revoke",
    "api_tokens",  # a token's name
    "team_campaigns",  # a name and two dates
    "logout",
    "policy_activate",
    "policy_shadow",
    "policy_shadow_clear",
    "bid_cancel",
    "confirm",
    "planned_campaign_withdraw",
    # A JSON document: its numbers are walked in tests/planning/test_views.py.
    "scenarios",
}
COVERED = {
    "bid_new", "bid_edit", "bid_preview", "team_budget_set", "staff_credits", "staff_budgets",
    "staff_tenants", "staff_tiers", "staff_tier_update", "policy_new", "policy_edit",
    "policy_replay", "policy_round_void", "team_members", "login", "admin_grant",
    "planned_campaigns",
}  # fmt: skip


def test_every_post_form_in_the_templates_is_walked_or_holds_no_number():
    names = set()
    for path in TEMPLATES.rglob("*.html"):
        for match in re.finditer(r'<form method="post"[^>]*>', path.read_text()):
            action = re.search(r"\{% url '([a-z_]+)'", match.group(0))
            names.add(action.group(1) if action else path.stem)
    forms_posting_to_their_page = {
        "grant": "admin_grant",
        "login": "login",
        "team_members": "team_members",
        "staff_credits": "staff_credits",
        "staff_budgets": "staff_budgets",
        "staff_tenants": "staff_tenants",
        "bid_form": "bid_new",
        "void": "policy_round_void",
        "edit": "policy_edit",
        "staff_tiers": "staff_tiers",
        "confirm": "confirm",  # core/confirm.py: a yes/no page, hidden fields only
        "campaigns": "planned_campaigns",
        "scenarios": "scenarios",
    }
    resolved = {forms_posting_to_their_page.get(n, n) for n in names}
    unknown = resolved - COVERED - NO_NUMBER
    assert not unknown, f"walk these forms with hostile numbers (or list them): {unknown}"


def test_hostile_numbers_in_every_form_are_errors_on_the_page_never_a_5xx(client, world):
    failures = []
    for target in _targets(world):
        page, who, extra = target[:3]
        client.force_login(world[who])
        posts_to = target[3] if len(target) > 3 else None
        form = _form(client, page, posts_to if posts_to != reverse("bid_preview") else None)
        url = posts_to or form.action or page
        numeric = (form.numeric | extra) & set(form.fields)
        assert numeric, f"{url}: no number field found to walk"
        for field in sorted(numeric):
            for value in HOSTILE:
                events = AuditEvent.objects.count()
                bids = Bid.objects.count()
                data = dict(form.fields, **{field: value})
                response = client.post(url, data)
                if response.status_code >= 500:
                    failures.append((url, field, value[:20], response.status_code))
                elif value in ("1e30", "1e5000", "9" * 5000) and response.status_code in (
                    301,
                    302,
                ):
                    failures.append((url, field, value[:20], "accepted"))
                elif AuditEvent.objects.count() != events or Bid.objects.count() != bids:
                    if value in ("1e30", "1e5000", "9" * 5000):
                        failures.append((url, field, value[:20], "wrote something"))
    assert not failures, failures


def test_hostile_numbers_in_query_forms_are_never_a_5xx(client, world):
    client.force_login(world["admin"])
    pages = [
        (reverse("policy_replay", args=[world["policy"].number]), "rounds"),
        (reverse("enforcement_list"), "node"),
        (reverse("enforcement_list"), "tenant"),
        (reverse("audit_review"), "tenant"),
    ]
    failures = [
        (url, field, value[:20], r.status_code)
        for url, field in pages
        for value in HOSTILE
        if (r := client.get(url, {field: value})).status_code >= 500
    ]
    assert not failures, failures
