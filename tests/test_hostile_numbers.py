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
from market.services.bids import bid_place
from market.services.orders.lifecycle import order_create
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
    order = order_create(
        user=manager, tenant=tenant, name="walk", values={"a100": 2000}, gpus=1, ceiling=50_000
    )
    return {
        "order": order,
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
        (reverse("order_new"), "manager", {"gpus", "min_gpus", "restart_minutes"}),
        (
            reverse("order_edit", args=[world["order"].pk]),
            "manager",
            {"gpus", "min_gpus", "restart_minutes"},
        ),
        (reverse("approval_new", args=["credit_grant"]), "admin", {"amount"}),
        (reverse("approval_new", args=["budget_raise"]), "admin", {"cap"}),
        (reverse("approval_new", args=["tier_change"]), "admin", {"capacity", "maintenance_gpus"}),
        (reverse("approval_new", args=["tenant_weight"]), "admin", {"weight"}),
        (reverse("team_requests"), "manager", {"amount"}),
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
    "order_pause",
    "order_resume",
    "order_cancel",
    # A JSON document: its numbers are walked in tests/planning/test_views.py.
    "scenarios",
    "approval_approve",  # a note
    "approval_reject",
    "approval_withdraw",  # no field
    # Checkboxes of categories and a URL: refusals in tests/alerts/test_alerts.py.
    "alerts",
    "alert_webhook_new",
    "alert_webhook_disable",
}
COVERED = {
    "bid_new", "bid_edit", "bid_preview", "team_budget_set", "staff_credits", "staff_budgets",
    "staff_tenants", "staff_tiers", "staff_tier_update", "policy_new", "policy_edit",
    "policy_replay", "policy_round_void", "team_members", "login", "admin_grant",
    "planned_campaigns", "order_new", "order_edit", "approval_new", "team_requests",
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
        "order_form": "order_new",
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


# Domain errors -------------------------------------------------------------------------------
# Every web view that calls a service is driven with a request that reaches the call while the
# service raises each app's domain error; the page must answer with the message (a form error
# or a flash message), never a 5xx. The views are found from the URLconf and the services from
# each view's source, so a new view that calls a service is walked or this test fails.

# Services a view may call that only compute or read, and refuse nothing a person did.
READS = {
    "bid_escrow",  # quantity x highest limit x hours, after the form bounded them
    "window_seconds",
    "tier_fragmentation",
    "placement_text",
    "ready_commands",
    "tokens_of",
}
# Views that answer a refusal with the site's 404 (the row is missing or another team's).
AS_404 = {"planned_campaign_withdraw", "api_token_revoke"}
# A service a view reaches only from another URL of the same view.
ELSEWHERE = {("policy_edit", "policy_active")}  # reached without a version number: policy_new


def _url_patterns(patterns=None):
    from django.urls import URLPattern, URLResolver, get_resolver

    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver):
            yield from _url_patterns(p.url_patterns)
        elif isinstance(p, URLPattern):
            yield p


def _is_service(obj) -> bool:
    import inspect

    func = inspect.unwrap(obj) if callable(obj) else None
    if not inspect.isfunction(func) or func.__module__.split(".")[0] not in APPS:
        return False
    if ".services" in func.__module__:
        return True
    source = inspect.getsource(func)
    return "transaction.atomic" in source.split("def ", 1)[0] or bool(
        re.search(r"raise (Market|Tenant|Telemetry|Planning)Error", source)
    )


APPS = {"audit", "tenants", "market", "telemetry", "planning", "governance"}


def views_calling_services() -> dict[str, tuple[object, set[str]]]:
    """{url name: (the view's module, the services its code reaches)}, following the helper
    functions of the view's own module."""
    import ast
    import inspect
    import sys

    found = {}
    for pattern in _url_patterns():
        view = inspect.unwrap(pattern.callback)
        module = sys.modules[view.__module__]
        if module.__name__.split(".")[0] not in APPS or ".api" in module.__name__:
            continue
        defs: dict[str, ast.AST] = {}

        def visit(node, prefix, defs=defs):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef):
                    defs[prefix + child.name] = child
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".")

        visit(ast.parse(inspect.getsource(module)), "")
        names: set[str] = set()
        todo, seen = [view.__qualname__], set()
        while todo:
            qualname = todo.pop()
            if qualname in seen or qualname not in defs:
                continue
            seen.add(qualname)
            for node in ast.walk(defs[qualname]):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                    todo.append(node.id)
        services = {n for n in names if _is_service(vars(module).get(n))} - READS
        if services:
            found[pattern.name] = (module, services)
    return found


def _recipes(world) -> dict[str, tuple[str, str, dict]]:
    """{url name: (who, url, POST data that passes the form and reaches the service)}."""
    import json

    from planning.models import PlannedCampaign
    from planning.views import example_document
    from telemetry.models import Gpu
    from tests.telemetry.market_data import fleet_node

    tier, bid, manager = world["tier"], world["bid"], world["manager"]
    fleet_node(name="walk", tier=tier, gpus=2, islands=1)
    gpu = Gpu.objects.filter(node__name="walk").first()
    soon = timezone.now() + timedelta(days=2)
    dates = {"starts_at": f"{soon:%Y-%m-%d %H:%M}", "ends_at": f"{soon + timedelta(days=1):%Y-%m-%d %H:%M}"}  # fmt: skip
    bid_terms = {"quantity": "1", "min_quantity": "1", "limit_a100": "2"}
    order = world["order"]
    order_terms = {
        "name": "walk",
        "value_a100": "2",
        "gpus": "1",
        "ceiling": "50",
        "restart_minutes": "5",
    }
    policy = reverse("policy_edit", args=[world["policy"].number])
    return {
        "bid_new": ("manager", reverse("bid_new"), {
            **bid_terms, "round": str(bid.round_id), "idempotency_key": "walk"}),
        "bid_edit": ("manager", reverse("bid_edit", args=[bid.pk]), bid_terms),
        "bid_cancel": ("manager", reverse("bid_cancel", args=[bid.pk]), {"confirm": "1"}),
        "staff_tiers": ("admin", reverse("staff_tiers"), {
            "new-slug": "h200", "new-name": "H200", "new-capacity": "4",
            "new-maintenance_gpus": "0", "new-active": "on"}),
        "staff_tier_update": ("admin", reverse("staff_tier_update", args=[tier.pk]), {
            f"t{tier.pk}-name": "A100", f"t{tier.pk}-capacity": "8",
            f"t{tier.pk}-maintenance_gpus": "0", f"t{tier.pk}-active": "on"}),
        "gpu_maintenance": ("admin", reverse("gpu_maintenance", args=[gpu.pk]), {
            "maintenance": "on"}),
        "policy_new": ("admin", reverse("policy_new"), _form(_as(world, "admin"), policy).fields),
        "policy_edit": ("admin", policy, _form(_as(world, "admin"), policy).fields),
        "policy_activate": ("admin", reverse("policy_activate", args=[world["policy"].number]), {
            "confirm": "1"}),
        "policy_shadow": ("admin", reverse("policy_shadow", args=[world["policy"].number]), {}),
        "policy_shadow_clear": ("admin", reverse("policy_shadow_clear"), {}),
        "policy_round_void": ("admin", reverse("policy_round_void", args=[bid.round_id]), {
            "reason": "walk", "confirm": "on"}),
        "planned_campaigns": ("manager", reverse("planned_campaigns"), {
            **dates, "name": "walk", "gpu_hours": "10", "tiers": str(tier.pk), "priority": "2"}),
        "planned_campaign_withdraw": ("manager", reverse(
            "planned_campaign_withdraw", args=[PlannedCampaign.objects.count() + 1]), {}),
        "scenarios": ("admin", reverse("scenarios"), {
            "document": json.dumps(example_document())}),
        "notifications_read": ("manager", reverse("notifications_read"), {}),
        "team_members": ("manager", reverse("team_members"), {
            "username": "walker", "role": "researcher", "password1": "correct-horse-battery-9",
            "password2": "correct-horse-battery-9"}),
        "team_member_role": ("manager", reverse("team_member_role"), {
            "username": manager.username, "role": "researcher", "confirm": "True"}),
        "team_member_remove": ("manager", reverse("team_member_remove"), {
            "username": manager.username, "confirm": "True"}),
        "team_campaigns": ("manager", reverse("team_campaigns"), {**dates, "name": "walk"}),
        "team_budget_set": ("manager", reverse("team_budget_set"), {
            "window": "day", "mode": "soft", "cap": "10"}),
        "staff_tenants": ("admin", reverse("staff_tenants"), {"name": "Walk", "weight": "1"}),
        "staff_credits": ("admin", reverse("staff_credits"), {
            "tenant": str(world["tenant"].pk), "amount": "10", "reason": "walk"}),
        "staff_budgets": ("admin", reverse("staff_budgets"), {
            "tenant": str(world["tenant"].pk), "window": "day", "mode": "soft", "cap": "10"}),
        "api_tokens": ("manager", reverse("api_tokens"), {"name": "walk"}),
        "api_token_revoke": ("manager", reverse("api_token_revoke", args=[1]), {}),
        "order_new": ("manager", reverse("order_new"), order_terms),
        "order_edit": ("manager", reverse("order_edit", args=[order.pk]), order_terms),
        "order_pause": ("manager", reverse("order_pause", args=[order.pk]), {}),
        "order_resume": ("manager", reverse("order_resume", args=[order.pk]), {}),
        "order_cancel": ("manager", reverse("order_cancel", args=[order.pk]), {"confirm": "1"}),
        "tenants_tenant_grant": ("admin", f"/admin/tenants/tenant/{world['tenant'].pk}/grant/", {
            "amount": "10", "reason": "walk"}),
        "approval_new": ("admin", reverse("approval_new", args=["tenant_weight"]), {
            "tenant": str(world["tenant"].pk), "weight": "2", "justification": "walk"}),
        "approval_approve": ("admin", reverse("approval_approve", args=[1]), {"note": "walk"}),
        "approval_reject": ("admin", reverse("approval_reject", args=[1]), {"note": "walk"}),
        "approval_withdraw": ("admin", reverse("approval_withdraw", args=[1]), {}),
        "team_requests": ("manager", reverse("team_requests"), {
            "amount": "10", "reason": "walk", "justification": "walk"}),
    }  # fmt: skip


def _as(world, who):
    from django.test import Client

    client = Client(raise_request_exception=False)  # a 500 is an answer to check, not a crash
    client.force_login(world[who])
    return client


def test_a_domain_error_from_any_service_a_view_calls_is_shown_never_a_5xx(
    world, monkeypatch, settings
):
    from core.errors import DomainError

    # One administrator's paths reach their services only when the two-person rule is off
    # (the rule's own paths are walked too, through the governance views).
    settings.GPUMARKET_APPROVALS = {}
    recipes = _recipes(world)
    views = views_calling_services()
    assert "bid_new" in views and "staff_credits" in views  # the discovery finds them
    missing = set(views) - set(recipes)
    assert not missing, f"add a request that reaches the service of these views: {missing}"
    errors = sorted(DomainError.__subclasses__(), key=lambda e: e.__name__)
    assert len(errors) >= 4
    failures = []
    for name, (module, services) in sorted(views.items()):
        who, url, data = recipes[name]
        client = _as(world, who)
        for service in sorted(services):
            if (name, service) in ELSEWHERE:
                continue
            for error in errors:
                message = f"refused by the walk ({error.__name__} from {service})"
                calls = []

                def refuse(*args, message=message, error=error, calls=calls, **kwargs):
                    calls.append(1)
                    raise error(message)

                with monkeypatch.context() as patch:
                    patch.setattr(module, service, refuse)
                    response = client.post(url, data, follow=True)
                shown = message in response.content.decode()
                if response.status_code >= 500:
                    failures.append((name, service, error.__name__, response.status_code))
                elif not calls:
                    failures.append((name, service, "the request did not reach the service"))
                elif name in AS_404:
                    if response.status_code != 404:
                        failures.append((name, service, error.__name__, response.status_code))
                elif not shown:
                    failures.append((name, service, error.__name__, "message not shown"))
    assert not failures, "\n".join(map(str, failures))


@pytest.mark.parametrize("weight", ["1" + "0" * 29, str(2**31), str(2**63)])
def test_a_tenant_weight_beyond_the_column_is_an_error_on_the_staff_page(client, weight):
    from tenants.models import Tenant

    client.force_login(factories.admin_user())
    before = Tenant.objects.count()
    response = client.post(reverse("staff_tenants"), {"name": "Huge", "weight": weight})
    assert response.status_code == 400
    assert b"errorlist" in response.content
    assert Tenant.objects.count() == before
