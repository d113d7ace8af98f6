"""Personal API tokens: issue, revoke, authenticate.

A token reads ``gm_<prefix>_<secret>``, minted and hashed by ``core.tokens`` like node tokens:
the prefix finds the row and is shown in the token list, only the hash is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

import audit.services as audit
from core.auth import auditor_exists, auditor_known
from core.tokens import token_matches, token_mint, token_prefix
from tenants.access import tenant_of
from tenants.errors import TenantError
from tenants.models import ApiToken

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
    """The active token ``raw`` stands for, or None. Checks the hash in constant time."""
    prefix = token_prefix(raw, scheme=TOKEN_PREFIX)
    if prefix is None:
        return None
    token = (
        ApiToken.objects.select_related("user", "user__membership__tenant")
        .annotate(user_is_auditor=auditor_exists("user_id"))
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )
    if token is None or not token_matches(raw, token.secret_hash):
        return None
    auditor_known(token.user, token.user_is_auditor)
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        # A plain UPDATE, no lock: concurrent requests may race, and either time is right.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
