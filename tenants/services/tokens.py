"""Personal API tokens: issue, revoke, authenticate.

A token reads ``gm_<prefix>_<secret>``, minted and hashed by ``core.tokens`` like node tokens:
the prefix finds the row and is shown in the token list, only the hash is stored.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

import audit.services as audit
from core.auth import auditor_group, auditor_known
from core.prepared import prepared_cursor
from core.tokens import token_matches, token_mint, token_prefix
from tenants.access import tenant_of
from tenants.errors import TenantError
from tenants.models import ApiToken, Membership, Tenant

TOKEN_PREFIX = "gm_"
MAX_ACTIVE_TOKENS = 20
# last_used_at is a hint for the owner ("is this token still in use?"), not an audit trail:
# writing it at most once a minute keeps a busy token from turning every read into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the full "gm_..." string; exists only in this object, never stored


def tokens_of(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


@transaction.atomic
def token_create(*, user: AbstractBaseUser, name: str) -> IssuedToken:
    """Issue a token for ``user``. The returned secret is the only copy: show it once."""
    name = (name or "").strip()
    if not name:
        raise TenantError("give the token a name, e.g. the machine or job that will use it")
    if len(name) > ApiToken._meta.get_field("name").max_length:
        raise TenantError("a token name can be at most 80 characters")
    if not user.is_active:
        raise TenantError("an inactive account cannot create API tokens")
    # Lock the user's row so two concurrent requests cannot both pass the count check.
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    active = ApiToken.objects.filter(user=user, revoked_at__isnull=True).count()
    if active >= MAX_ACTIVE_TOKENS:
        raise TenantError(
            f"you already have {active} active tokens (the limit is {MAX_ACTIVE_TOKENS}); "
            "revoke one you no longer use"
        )
    minted = token_mint(scheme=TOKEN_PREFIX)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=minted.prefix, secret_hash=minted.hash
    )
    audit.record(
        actor=user,
        action="apitoken.create",
        target=token,
        tenant=tenant_of(user),
        after={"name": name, "prefix": minted.prefix},
    )
    return IssuedToken(token=token, secret=minted.secret)


@transaction.atomic
def token_revoke(*, user: AbstractBaseUser, token_id: int) -> ApiToken:
    """Revoke one of ``user``'s tokens; it fails authentication from the next request on.

    Revoking a revoked token is a no-op. Another user's token is reported as missing.
    """
    token = ApiToken.objects.select_for_update().filter(user=user, pk=token_id).first()
    if token is None:
        raise TenantError(f"you have no API token with id {token_id}")
    if token.revoked_at is not None:
        return token
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit.record(
        actor=user,
        action="apitoken.revoke",
        target=token,
        tenant=tenant_of(user),
        before={"revoked_at": None},
        after={
            "name": token.name,
            "prefix": token.prefix,
            "revoked_at": token.revoked_at.isoformat(),
        },
    )
    return token


def token_authenticate(*, raw: str) -> ApiToken | None:
    """The active token ``raw`` stands for, or None. Checks the hash in constant time.

    The token comes with its user, the user's membership and tenant, and whether the user is
    an auditor, read as the database has them now (revocation, a role changed, a member
    removed count from the next request on), in one statement."""
    prefix = token_prefix(raw, scheme=TOKEN_PREFIX)
    if prefix is None:
        return None
    token = _token_read(prefix=prefix)
    if token is None or not token_matches(raw, token.secret_hash):
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        # A plain UPDATE, no lock: concurrent requests may race, and either time is right.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


@dataclass(frozen=True)
class _Columns:
    """One model's columns in the token lookup's row: where they start, their attribute
    names, and the converters the ORM would apply on this database (column index,
    converters, column expression; PostgreSQL needs almost none)."""

    model: type[Model]
    start: int
    names: tuple[str, ...]
    converters: tuple[tuple[int, tuple, Any], ...]

    def build(self, row: tuple) -> Model | None:
        values = list(row[self.start : self.start + len(self.names)])
        if values[0] is None:  # the primary key: no row on this side of an outer join
            return None
        for i, converters, expression in self.converters:
            for convert in converters:
                values[i] = convert(values[i], expression, connection)
        return self.model.from_db(connection.alias, self.names, values)


@functools.cache
def _token_lookup() -> tuple[str, tuple[_Columns, ...]]:
    """The token lookup as one SQL statement (built once per process from the models' own
    table and column names) and how to read its row. The same query through the ORM spent
    about eight times the CPU building itself and its objects on every request."""
    user_model = get_user_model()
    groups = user_model._meta.get_field("groups")
    through = groups.remote_field.through._meta
    joined = (
        (ApiToken, "t", None),
        (user_model, "u", "JOIN {u} u ON u.{u_pk} = t.{t_user}"),
        (Membership, "m", "LEFT JOIN {m} m ON m.{m_user} = u.{u_pk}"),
        (Tenant, "n", "LEFT JOIN {n} n ON n.{n_pk} = m.{m_tenant}"),
    )
    q = connection.ops.quote_name

    def column(name: str) -> str:
        return q(ApiToken._meta.get_field(name).column)

    names = {
        "t": q(ApiToken._meta.db_table),
        "u": q(user_model._meta.db_table),
        "m": q(Membership._meta.db_table),
        "n": q(Tenant._meta.db_table),
        "u_pk": q(user_model._meta.pk.column),
        "n_pk": q(Tenant._meta.pk.column),
        "t_user": q(ApiToken._meta.get_field("user").column),
        "m_user": q(Membership._meta.get_field("user").column),
        "m_tenant": q(Membership._meta.get_field("tenant").column),
    }
    columns, selected, start = [], [], 0
    for model, alias, _join in joined:
        fields = model._meta.concrete_fields
        selected += [f"{alias}.{q(f.column)}" for f in fields]
        converters = []
        for i, f in enumerate(fields):
            expression = f.get_col(alias)
            found = connection.ops.get_db_converters(expression) + f.get_db_converters(connection)
            if found:
                converters.append((i, tuple(found), expression))
        columns.append(
            _Columns(
                model=model,
                start=start,
                names=tuple(f.attname for f in fields),
                converters=tuple(converters),
            )
        )
        start += len(fields)
    auditor = (
        f"EXISTS (SELECT 1 FROM {q(through.db_table)} ug JOIN {q(Group._meta.db_table)} g "
        f"ON g.{q(Group._meta.pk.column)} = ug.{q(groups.m2m_reverse_name())} "
        f"WHERE ug.{q(groups.m2m_column_name())} = u.{names['u_pk']} "
        f"AND g.{q(Group._meta.get_field('name').column)} = %s)"
    )
    joins = " ".join(join.format(**names) for _m, _a, join in joined if join)
    sql = (
        f"SELECT {', '.join(selected)}, {auditor} FROM {names['t']} t {joins} "
        f"WHERE t.{column('prefix')} = %s AND t.{column('revoked_at')} IS NULL"
    )
    return sql, tuple(columns)


def _token_read(*, prefix: str) -> ApiToken | None:
    """The active token with ``prefix``, its user, membership and tenant, and the auditor
    answer recorded on the user, as ``select_related`` would have given them."""
    sql, (token_columns, user_columns, membership_columns, tenant_columns) = _token_lookup()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [auditor_group(), prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    token = token_columns.build(row)
    user = user_columns.build(row)
    membership = membership_columns.build(row)
    ApiToken._meta.get_field("user").set_cached_value(token, user)
    user_field = Membership._meta.get_field("user")
    user_field.remote_field.set_cached_value(user, membership)  # None: no team, no query
    if membership is not None:
        user_field.set_cached_value(membership, user)
        Membership._meta.get_field("tenant").set_cached_value(membership, tenant_columns.build(row))
    auditor_known(user, row[-1])
    return token
