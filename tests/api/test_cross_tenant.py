"""Tenant B's token against tenant A's objects, on every route under /api/v1/.

The routes are read from the URL resolver, so a new endpoint is covered the day it is added;
one whose path parameter cannot be tied to a model, or a tenant-owned model the world has no
row of, fails the test instead of being skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.db.models import Model
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from audit.models import AuditEvent
from market.models import Allocation, Bid, BidLimit
from planning.models import PlannedCampaign
from telemetry.models import EnforcementAction
from tenants.models import Account, ApiToken, Budget, Campaign, Notification, Transfer

pytestmark = pytest.mark.django_db

# Routes without a name that are aliases, not endpoints of their own.
UNNAMED_ALIASES = {
    "api/v1/telemetry/ingest/",  # the ingest view, also accepted with a slash
    "api/^.*$",  # the JSON 404 for any other /api/ path
}
MISSING_PK = 987_654_321


@dataclass(frozen=True)
class Route:
    pattern: str  # the joined URL pattern text, for messages
    name: str  # namespaced URL name, for reverse()
    params: tuple[str, ...]
    callback: object

    @property
    def view_class(self):
        return getattr(self.callback, "cls", None)

    def methods(self) -> list[str]:
        actions = getattr(self.callback, "actions", None)
        if actions:
            return sorted(m.upper() for m in actions) + ["HEAD"] * ("get" in actions)
        cls = self.view_class
        if cls is not None:
            return sorted(
                m.upper() for m in cls.http_method_names if m != "options" and hasattr(cls, m)
            )
        return ["GET", "POST"]  # a plain Django view: try both

    def model(self) -> type[Model] | None:
        cls = self.view_class
        if cls is None:
            return None
        queryset = getattr(cls, "queryset", None)
        if queryset is not None:
            return queryset.model
        serializer = getattr(cls, "serializer_class", None)
        meta = getattr(serializer, "Meta", None)
        return getattr(meta, "model", None)


def _params(pattern) -> tuple[str, ...]:
    converters = getattr(pattern, "converters", None)
    if converters:
        return tuple(converters)
    return tuple(pattern.regex.groupindex)


def api_routes() -> list[Route]:
    routes: list[Route] = []

    def walk(patterns, prefix: str, namespace: str, params: tuple[str, ...]) -> None:
        for entry in patterns:
            text = prefix + str(entry.pattern)
            found = params + _params(entry.pattern)
            if isinstance(entry, URLResolver):
                ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
                walk(entry.url_patterns, text, ns, found)
            elif isinstance(entry, URLPattern) and text.startswith("api/v1/"):
                if not entry.name:
                    assert text in UNNAMED_ALIASES, (
                        f"route {text} has no name: name it so it is tested"
                    )
                    continue
                routes.append(Route(text, namespace + entry.name, found, entry.callback))

    walk(get_resolver().url_patterns, "", "", ())
    return routes


def is_tenant_owned(model: type[Model] | None) -> bool:
    return model is not None and any(f.name == "tenant" for f in model._meta.fields)


def state() -> dict:
    """Everything a request could change that matters here (not last_used_at of tokens)."""
    return {
        "transfers": Transfer.objects.count(),
        "balances": list(Account.objects.order_by("pk").values_list("pk", "balance")),
        "bids": list(
            Bid.objects.order_by("pk").values_list(
                "pk", "status", "quantity", "min_quantity", "escrow"
            )
        ),
        "limits": list(BidLimit.objects.order_by("pk").values_list("bid_id", "tier_id", "price")),
        "allocations": list(Allocation.objects.order_by("pk").values_list("pk", "status", "gpus")),
        "budgets": list(Budget.objects.order_by("pk").values_list("pk", "cap", "mode", "active")),
        "campaigns": Campaign.objects.count(),
        "planned": list(PlannedCampaign.objects.order_by("pk").values_list("pk", "withdrawn_at")),
        "notifications": list(Notification.objects.order_by("pk").values_list("pk", "read_at")),
        "actions": list(EnforcementAction.objects.order_by("pk").values_list("pk", "state")),
        "tokens": list(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        "audit": AuditEvent.objects.count(),
    }


def write_body(world) -> dict:
    """A body that would be valid if the request were allowed, pointing at A's objects."""
    return {
        "round": world.open_round.pk,
        "quantity": 1,
        "min_quantity": 0,
        "limits": {"a100": "1.5"},
        "campaign": world.a.campaign.pk,
        "note": "cross-tenant probe",
    }


def call(api, method: str, url: str, body: dict):
    if method in {"POST", "PUT", "PATCH"}:
        return getattr(api, method.lower())(
            url, data=json.dumps(body), content_type="application/json"
        )
    return getattr(api, method.lower())(url)


def leaks(response, world) -> list[str]:
    """Tenant A's identifying strings found in a response to B."""
    text = response.content.decode(errors="replace")
    needles = [
        world.a.tenant.slug,
        world.a.tenant.name,
        world.a.user.get_username(),
        world.a.token.split("_")[1],
    ]
    return [n for n in needles if n in text]


def test_routes_are_found():
    names = {r.name for r in api_routes()}
    assert {
        "bid-detail",
        "bid-cancel",
        "allocation-detail",
        "allocation-pace",
        "transfer-list",
    } <= names


def test_every_object_route_answers_404_to_another_tenant_and_changes_nothing(world):
    b = world.b.client()
    a_objects = world.a.objects()
    checked = 0
    for route in api_routes():
        if not route.params:
            continue
        model = route.model()
        assert model is not None, (
            f"{route.pattern}: cannot tell which model it addresses; give its view a queryset"
        )
        if not is_tenant_owned(model):
            continue  # tiers, rounds: shared by every tenant
        target = a_objects.get(model)
        assert target is not None, (
            f"{route.pattern}: the world has no {model.__name__} of tenant A; add one"
        )
        assert set(route.params) == {"pk"}, f"{route.pattern}: unexpected parameters {route.params}"
        url = reverse(route.name, kwargs={"pk": target.pk})
        missing_url = reverse(route.name, kwargs={"pk": MISSING_PK})
        for method in route.methods():
            before = state()
            response = call(b, method, url, write_body(world))
            assert state() == before, f"{method} {url} by tenant B changed something"
            missing = call(b, method, missing_url, write_body(world))
            # Same answer as for an id that does not exist: existence does not leak.
            assert response.status_code == missing.status_code, f"{method} {url}"
            assert response.status_code in (403, 404), f"{method} {url}: {response.status_code}"
            if method != "HEAD":
                assert response.json()["error"]["code"] in ("not_found", "permission_denied")
            if not route.name.startswith("audit"):
                assert response.status_code == 404, f"{method} {url}: {response.status_code}"
            assert not leaks(response, world), f"{method} {url} leaks {leaks(response, world)}"
            checked += 1
    assert checked >= 10


def test_no_collection_shows_or_touches_another_tenants_rows(world):
    b = world.b.client()
    checked = 0
    for route in api_routes():
        if route.params:
            continue
        url = reverse(route.name)
        for method in route.methods():
            before = state()
            response = call(b, method, url, write_body(world))
            assert not leaks(response, world), f"{method} {url} leaks {leaks(response, world)}"
            if method == "GET" and response.status_code == 200:
                body = response.json()
                rows = body["results"] if isinstance(body, dict) and "results" in body else body
                model = route.model()
                if isinstance(rows, list) and is_tenant_owned(model):
                    ids = [row["id"] for row in rows]
                    foreign = model.objects.filter(pk__in=ids).exclude(tenant=world.b.tenant)
                    assert not foreign.exists(), (
                        f"GET {url} lists another tenant's {model.__name__}"
                    )
            if method == "POST":
                # Writes aimed at A's objects (A's campaign in the body) are refused whole.
                assert response.status_code in (401, 403, 404, 405), (
                    f"POST {url}: {response.status_code}"
                )
                assert state() == before, f"POST {url} by tenant B changed something"
            elif method in ("GET", "HEAD"):
                assert state() == before, f"{method} {url} changed something"
            checked += 1
    assert checked >= 10


def test_the_lists_do_show_a_tenant_its_own_rows(world):
    """The same probes from A's side, so the leak test above cannot pass by listing nothing."""
    a = world.a.client()
    for name, model in [
        ("bid-list", Bid),
        ("allocation-list", Allocation),
        ("transfer-list", Transfer),
        ("budget-list", Budget),
        ("campaign-list", Campaign),
        ("notification-list", Notification),
        ("telemetry-api:actions", EnforcementAction),
    ]:
        body = a.get(reverse(name)).json()
        rows = body["results"] if isinstance(body, dict) else body
        ids = {row["id"] for row in rows}
        assert ids == set(
            model.objects.filter(tenant=world.a.tenant).values_list("pk", flat=True)
        ), name
        assert ids, f"{name}: tenant A should have rows"
