"""Personal API tokens: shown once, stored hashed, revoked means refused at once."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection
from django.urls import reverse
from rest_framework.test import APIClient

from audit.models import AuditEvent
from core.auth import is_auditor
from tenants.errors import TenantError
from tenants.models import ApiToken, Membership
from tenants.services import member_remove, member_role_set
from tenants.services.tokens import (
    MAX_ACTIVE_TOKENS,
    token_authenticate,
    token_create,
    token_revoke,
)
from tests import factories

pytestmark = pytest.mark.django_db


def bearer(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


@pytest.fixture
def member():
    return factories.member(tenant=factories.tenant(credits=5_000))


def test_token_page_shows_the_secret_once_and_stores_only_its_hash(client, member):
    client.force_login(member)
    created = client.post(reverse("api_tokens"), {"name": "training box"})
    assert created.status_code == 200
    assert "no-store" in created["Cache-Control"]
    token = ApiToken.objects.get(user=member)
    secret = created.context["new_secret"]
    assert secret.startswith(f"gm_{token.prefix}_")
    assert secret in created.content.decode()

    # At rest: the SHA-256 of the token, and the secret part appears in no column.
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenants_apitoken WHERE id = %s", [token.pk])
        row = cursor.fetchone()
    assert all(secret.split("_", 2)[2] not in str(value) for value in row)

    # Never again: the list page shows the prefix only.
    listing = client.get(reverse("api_tokens"))
    assert secret not in listing.content.decode()
    assert f"gm_{token.prefix}_" in listing.content.decode()

    me = bearer(secret).get("/api/v1/me")
    assert me.status_code == 200, me.content
    assert me.json()["username"] == member.username
    assert me.json()["token"] == "training box"


def test_revoked_token_is_refused_on_the_very_next_request(client, member):
    issued = token_create(user=member, name="ci")
    api = bearer(issued.secret)
    assert api.get("/api/v1/balance").status_code == 200

    client.force_login(member)
    response = client.post(reverse("api_token_revoke", args=[issued.token.pk]))
    assert response.status_code == 302

    refused = api.get("/api/v1/balance")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert refused.json()["error"]["code"] == "authentication_failed"
    assert "revoked" in refused.json()["error"]["message"]
    assert AuditEvent.objects.filter(
        action="apitoken.revoke", object_id=str(issued.token.pk)
    ).exists()


def test_another_users_token_cannot_be_revoked(client, member):
    other = factories.member(tenant=factories.tenant())
    issued = token_create(user=other, name="theirs")
    client.force_login(member)
    assert client.post(reverse("api_token_revoke", args=[issued.token.pk])).status_code == 404
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is None
    with pytest.raises(TenantError):
        token_revoke(user=member, token_id=issued.token.pk)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer gm_nothing_here",
        "Bearer gm_",
        "Bearer not-a-token",
        "Bearer two words",
        "Bearer",
    ],
)
def test_malformed_or_unknown_tokens_get_401_in_the_error_shape(header):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=header)
    response = api.get("/api/v1/me")
    assert response.status_code == 401
    body = response.json()["error"]
    assert set(body) == {"code", "message", "fields"}
    assert body["message"]


def test_a_guessed_secret_with_a_real_prefix_is_refused(member):
    issued = token_create(user=member, name="real")
    forged = f"gm_{issued.token.prefix}_{'A' * 43}"
    assert bearer(forged).get("/api/v1/me").status_code == 401


def test_no_credentials_is_401_with_a_challenge():
    response = APIClient().get("/api/v1/bids")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_token_name_is_required_and_active_tokens_are_capped(client, member):
    client.force_login(member)
    empty = client.post(reverse("api_tokens"), {"name": "  "})
    assert empty.status_code == 400
    assert not ApiToken.objects.filter(user=member).exists()
    for n in range(MAX_ACTIVE_TOKENS):
        token_create(user=member, name=f"t{n}")
    with pytest.raises(TenantError, match="revoke one"):
        token_create(user=member, name="one too many")
    token_revoke(user=member, token_id=ApiToken.objects.filter(user=member).first().pk)
    assert token_create(user=member, name="fits again").token.pk


def test_last_used_is_recorded(member):
    issued = token_create(user=member, name="job")
    assert issued.token.last_used_at is None
    bearer(issued.secret).get("/api/v1/me")
    issued.token.refresh_from_db()
    assert issued.token.last_used_at is not None


def test_a_token_acts_in_its_users_team_with_the_role_it_has_now(member, django_assert_num_queries):
    issued = token_create(user=member, name="box")
    api = bearer(issued.secret)
    api.get("/api/v1/me")  # the first use records last_used_at
    with django_assert_num_queries(1):  # token, user, team and role in one statement
        me = api.get("/api/v1/me").json()
    assert (me["username"], me["role"]) == (member.username, Membership.Role.RESEARCHER)
    assert me["tenant"]["slug"] == member.membership.tenant.slug
    manager = factories.member(tenant=member.membership.tenant, role=Membership.Role.MANAGER)
    member_role_set(
        tenant=member.membership.tenant,
        username=member.username,
        role=Membership.Role.MANAGER,
        actor=manager,
    )
    assert api.get("/api/v1/me").json()["role"] == Membership.Role.MANAGER


def test_a_member_taken_off_the_team_is_refused_on_the_next_request(member):
    manager = factories.member(tenant=member.membership.tenant, role=Membership.Role.MANAGER)
    api = bearer(token_create(user=member, name="box").secret)
    assert api.get("/api/v1/balance").status_code == 200
    member_remove(tenant=member.membership.tenant, username=member.username, actor=manager)
    refused = api.get("/api/v1/balance")
    assert refused.status_code == 401
    assert "disabled" in refused.json()["error"]["message"]


def test_an_active_account_without_a_team_has_no_tenant_data(member):
    api = bearer(token_create(user=member, name="box").secret)
    Membership.objects.filter(user=member).delete()
    me = api.get("/api/v1/me")
    assert me.status_code == 200
    assert (me.json()["tenant"], me.json()["role"]) == (None, None)
    assert api.get("/api/v1/balance").status_code == 403


def test_the_token_lookup_reads_the_rows_the_orm_reads(member, django_assert_num_queries):
    issued = token_create(user=member, name="box")
    with django_assert_num_queries(2):  # the lookup, and last_used_at on first use
        token = token_authenticate(raw=issued.secret)
    with django_assert_num_queries(0):  # everything the API reads came with the token
        got = [token, token.user, token.user.membership, token.user.membership.tenant]
        assert token.user.membership.user is token.user
        assert is_auditor(token.user) is False
    expected = [
        ApiToken.objects.get(pk=token.pk),
        type(member).objects.get(pk=member.pk),
        Membership.objects.get(user=member),
        member.membership.tenant,
    ]
    pairs = zip(got, expected, strict=True)
    for got, expected in pairs:
        fields = type(expected)._meta.concrete_fields
        assert [getattr(got, f.attname) for f in fields] == [
            getattr(expected, f.attname) for f in fields
        ]
        assert got._state.adding is False
