"""The auditor reads the platform and writes nothing; managers read their own team's trail.

The write test walks every URL pattern the project mounts (the admin, the pages, the API), so
a page or endpoint added later is covered without being named here.
"""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.exceptions import Resolver404
from django.urls.resolvers import RegexPattern

from audit.models import AuditEvent
from governance.middleware import OPEN_TO_AUDITORS
from market.models import PolicyVersion
from tenants.api.authentication import ApiTokenAuthentication
from tenants.ledger import credits_grant
from tenants.services import token_create
from tests.governance.conftest import signed_in

pytestmark = pytest.mark.django_db

WRITE_METHODS = ("post", "put", "patch", "delete")
SAMPLE = {"int": "1", "slug": "a100", "str": "a100", "path": "1", "uuid": "0" * 32}


def _group_sample(match: re.Match) -> str:
    body = match.group(1)
    # An alternation of names (the admin's app labels): the first; anything else: "1".
    return body.split("|")[0] if re.fullmatch(r"[\w|]+", body) else "1"


def _route(pattern) -> str:
    """A concrete path for one pattern: each converter or group filled with a sample value."""
    text = str(pattern.pattern)
    if isinstance(pattern.pattern, RegexPattern):
        text = re.sub(r"\(\?P<\w+>([^)]*)\)", _group_sample, text)
        return text.strip("^$").replace("\\", "").replace(".*", "x").replace("?", "")
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE[m.group(1) or "str"], text)


def _patterns(resolver: URLResolver | None = None, prefix: str = "") -> list[tuple[str, object]]:
    """(path, view) for every pattern the project mounts."""
    resolver = resolver or get_resolver()
    out: list[tuple[str, object]] = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            out += _patterns(entry, prefix + _route(entry))
        elif isinstance(entry, URLPattern):
            out.append(("/" + prefix + _route(entry), entry.callback))
    return out


def every_path() -> list[str]:
    paths, wrong = set(), []
    for path, view in _patterns():
        try:
            reached = resolve(path).func
        except Resolver404:
            reached = None
        if reached is not view:
            wrong.append(path)
        paths.add(path)
    # A pattern this walk cannot fill in must be taught to it, not silently left out.
    assert not wrong, f"cannot build a URL that reaches these patterns' views: {wrong}"
    return sorted(paths)


def test_the_walk_covers_pages_admin_and_api():
    paths = every_path()
    for expected in (
        "/staff/credits/",
        "/market/policy/v1/activate/",
        "/market/admin/tiers/1/",
        "/governance/1/approve/",
        "/api/v1/bids",
        "/api/v1/approvals/1/approve",
        "/admin/auth/user/add/",
    ):
        assert expected in paths, expected
    assert len(paths) > 200


def _takes_user_tokens(path: str) -> bool:
    view = resolve(path).func
    view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
    classes = getattr(view_class, "authentication_classes", None)
    if classes is None:
        return False
    return ApiTokenAuthentication in classes


def _denied(path: str, method: str) -> int:
    return AuditEvent.objects.filter(
        action="access.denied", object_id=path[:64], after__method=method.upper()
    ).count()


def test_the_auditor_writes_nothing_anywhere(world):
    """Every URL, every write method, by session and by API token: 403 and an audited
    attempt, and nothing but the attempts reaches the audit log."""
    client = signed_in(world.auditor)
    secret = token_create(user=world.auditor, name="audit-laptop").secret
    api = signed_in(world.auditor)
    api.logout()
    others_before = AuditEvent.objects.exclude(action="access.denied").count()
    checked = 0
    for path in every_path():
        if resolve(path).view_name in OPEN_TO_AUDITORS:
            continue
        for method in WRITE_METHODS:
            response = getattr(client, method)(path, data={"confirm": "1"})
            assert response.status_code == 403, (method, path, response.status_code)
            assert _denied(path, method) == 1, (method, path)
            if path.startswith("/api/"):
                response = getattr(api, method)(
                    path,
                    data={},
                    content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {secret}",
                )
                if _takes_user_tokens(path):
                    assert response.status_code == 403, ("token", method, path)
                    assert _denied(path, method) == 2, ("token", method, path)
                else:
                    # A node's endpoint (a person's token is no credential there), a method
                    # it does not answer, or no endpoint at all: nothing can be written.
                    assert response.status_code in (401, 404, 405), ("token", method, path)
            checked += 1
    assert checked > 400
    # The token's creation is the one other event: no attempt changed anything.
    assert AuditEvent.objects.exclude(action="access.denied").count() == others_before
    event = AuditEvent.objects.filter(action="access.denied").last()
    assert event.actor_label == "auditor" and event.after["role"] == "auditor"


def test_the_auditor_reads_audit_ledger_rounds_and_policies(world):
    client = signed_in(world.auditor)
    version = PolicyVersion.objects.get()
    for path in (
        "/audit/",
        "/audit/export.csv",
        "/market/admin/rounds/",
        "/market/admin/tiers/",
        "/market/policy/",
        f"/market/policy/v{version.number}/",
        "/staff/credits/",
        "/staff/budgets/",
        "/staff/tenants/",
        "/governance/",
        "/api/v1/audit",
        "/api/v1/audit/verify",
        "/api/v1/approvals",
    ):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
    verified = client.post("/audit/verify/", follow=True)
    assert verified.status_code == 200
    assert "intact" in verified.content.decode().lower()
    # The grants list is the platform's ledger of issued credits.
    assert "Vision Lab" in client.get("/staff/credits/").content.decode()


def test_a_manager_reaching_a_staff_write_is_refused_and_audited(world):
    client = signed_in(world.vision_manager)
    response = client.post(
        "/staff/credits/", {"tenant": world.vision.pk, "amount": "5", "reason": "mine"}
    )
    assert response.status_code == 403
    event = AuditEvent.objects.get(action="access.denied")
    assert event.actor_label == "vera-manager"
    assert event.tenant_id == world.vision.pk
    assert event.after == {
        "method": "POST",
        "path": "/staff/credits/",
        "view": "staff_credits",
        "role": "manager",
    }


# Managers and their team's trail ------------------------------------------------------------


def _team_events(world):
    credits_grant(tenant=world.vision, amount=1_000, reason="vision only", actor=world.admin)
    credits_grant(tenant=world.speech, amount=2_000, reason="speech only", actor=world.admin)


def test_a_manager_sees_the_team_trail_and_never_another_team(world):
    _team_events(world)
    client = signed_in(world.vision_manager)
    body = client.get("/audit/").content.decode()
    assert "vision-lab" in body and "speech-lab" not in body
    # Asking for the other team by its id still shows only the manager's own team.
    body = client.get("/audit/", {"tenant": world.speech.pk}).content.decode()
    assert "speech-lab" not in body
    rows = list(
        csv.DictReader(
            io.StringIO(b"".join(client.get("/audit/export.csv").streaming_content).decode())
        )
    )
    assert rows and {r["tenant"] for r in rows} == {"vision-lab"}
    api = client.get("/api/v1/audit", {"tenant": world.speech.pk, "limit": 1000}).json()
    assert api["results"] and {e["tenant"] for e in api["results"]} == {world.vision.pk}
    other = AuditEvent.objects.filter(tenant=world.speech).first()
    assert client.get(f"/api/v1/audit/{other.pk}").status_code == 404
    # The whole chain is for whole-log readers.
    assert client.post("/audit/verify/").status_code == 403
    assert client.get("/api/v1/audit/verify").status_code == 403


def test_a_researcher_reads_no_audit_trail(world):
    client = signed_in(world.vision_researcher)
    assert client.get("/audit/").status_code == 403
    assert client.get("/api/v1/audit").status_code == 403
