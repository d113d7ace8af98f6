"""Tenants and memberships."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.validators import ASCIIUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

import audit.services as audit
from tenants.errors import TenantError
from tenants.ledger import tenant_accounts_create
from tenants.models import Membership, Tenant

# Weights are relative entitlements; a million to one is more spread than any fairness floor
# needs, and it keeps the column (a 32-bit integer) far from overflowing.
MAX_WEIGHT = 1_000_000


@transaction.atomic
def tenant_create(
    *, name: str, actor: AbstractBaseUser | None, weight: int = 1, slug: str = ""
) -> Tenant:
    name = (name or "").strip()
    if not name:
        raise TenantError("a tenant needs a name")
    weight_validate(weight)
    slug = slug or slugify(name)
    if not slug:
        raise TenantError(f"cannot make a slug from {name!r}; give one")
    if Tenant.objects.filter(slug=slug).exists() or Tenant.objects.filter(name=name).exists():
        raise TenantError(f"a tenant named {name!r} (slug {slug!r}) already exists")
    tenant = Tenant.objects.create(name=name, slug=slug, weight=weight)
    tenant_accounts_create(tenant=tenant)
    audit.record(
        actor=actor,
        action="tenant.create",
        target=tenant,
        tenant=tenant,
        after={"name": name, "slug": slug, "weight": weight},
    )
    return tenant


def weight_validate(weight: object) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= MAX_WEIGHT:
        raise TenantError(f"weight must be a whole number from 0 to {MAX_WEIGHT}, got {weight!r}")
    return weight


@transaction.atomic
def tenant_weight_set(*, tenant: Tenant, weight: int, actor: AbstractBaseUser | None) -> Tenant:
    """Change a tenant's entitlement (the fairness floor's and max-min's weight). Applies to
    rounds cleared after it; unchanged = no write."""
    weight_validate(weight)
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if locked.weight == weight:
        return locked
    before = locked.weight
    locked.weight = weight
    locked.save(update_fields=["weight"])
    audit.record(
        actor=actor,
        action="tenant.weight",
        target=locked,
        tenant=locked,
        before={"weight": before},
        after={"weight": weight},
    )
    tenant.weight = weight
    return locked


@transaction.atomic
def member_add(
    *,
    tenant: Tenant,
    username: str,
    role: str,
    actor: AbstractBaseUser | None,
    password: str | None = None,
    email: str = "",
) -> Membership:
    """Add a user (created if new) to a tenant with a role."""
    if role not in Membership.Role.values:
        raise TenantError(f"role must be one of {Membership.Role.values}, got {role!r}")
    username = (username or "").strip()
    if not username:
        raise TenantError("a member needs a username")
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username, defaults={"email": email})
    if not created and (user.is_staff or user.is_superuser):
        raise TenantError(f"{username!r} is a platform staff account; it cannot join a tenant")
    if created:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save(update_fields=["password"])
    existing = Membership.objects.select_for_update().filter(user=user).first()
    if existing is not None and existing.tenant_id != tenant.pk:
        raise TenantError(f"user {username!r} already belongs to another tenant")
    before = {"role": existing.role} if existing else None
    if existing is not None:
        existing.role = role
        existing.save(update_fields=["role"])
        membership = existing
    else:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit.record(
        actor=actor,
        action="membership.set",
        target=membership,
        tenant=tenant,
        before=before,
        after={"user": username, "role": role},
    )
    return membership


def username_check(raw: str) -> str:
    """A new account's username: NFKC-normalised (so a full-width "ｒｏｏｔ" is "root"), then
    ASCII letters, digits and @.+-_ only, so no look-alike of another script can pass for an
    existing name; and not the name of any account in another case. Raises TenantError."""
    User = get_user_model()
    username = User.normalize_username((raw or "").strip())
    if not username:
        raise TenantError("a member needs a username")
    try:
        ASCIIUsernameValidator()(username)
    except ValidationError:
        raise TenantError(
            f"{username!r}: use English letters, digits and @ . + - _ only (150 at most); "
            "letters of other scripts can pass for an existing name"
        ) from None
    if len(username) > 150:
        raise TenantError("a username has at most 150 characters")
    if User.objects.filter(username__iexact=username).exists():
        raise TenantError(f"the username {username!r} is taken; choose another")
    return username


@transaction.atomic
def member_create(
    *,
    tenant: Tenant,
    username: str,
    role: str,
    password: str,
    actor: AbstractBaseUser | None,
    email: str = "",
) -> Membership:
    """Create a NEW account and make it a member of ``tenant``. Never attaches an existing
    account: the team page cannot reach the platform's staff or another team's people.
    Django's password validators apply. Raises TenantError saying what to fix."""
    if role not in Membership.Role.values:
        raise TenantError(f"role must be one of {Membership.Role.values}, got {role!r}")
    username = username_check(username)
    User = get_user_model()
    user = User(username=username, email=email)
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise TenantError(" ".join(exc.messages)) from None
    user.set_password(password)
    user.save()
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit.record(
        actor=actor,
        action="membership.create",
        target=membership,
        tenant=tenant,
        after={"user": username, "role": role},
    )
    return membership


def _membership_locked(*, tenant: Tenant, username: str) -> Membership:
    # Every membership of the tenant, locked in pk order: the last-manager check below must
    # see the others as they are while this change commits.
    memberships = list(
        Membership.objects.select_for_update()
        .filter(tenant=tenant)
        .select_related("user")
        .order_by("pk")
    )
    for membership in memberships:
        if membership.user.get_username() == username:
            return membership
    raise TenantError(f"{username} is not a member of {tenant.name}")


def _refuse_last_manager(membership: Membership, *, doing: str) -> None:
    if membership.role != Membership.Role.MANAGER:
        return
    managers = Membership.objects.filter(
        tenant_id=membership.tenant_id, role=Membership.Role.MANAGER
    ).count()
    if managers <= 1:
        raise TenantError(
            f"{membership.user.get_username()} is the last manager of {membership.tenant.name} "
            f"and cannot be {doing}; make another member a manager first"
        )


@transaction.atomic
def member_role_set(
    *, tenant: Tenant, username: str, role: str, actor: AbstractBaseUser | None
) -> Membership:
    """Change the role of a member of ``tenant``; the last manager keeps the role."""
    if role not in Membership.Role.values:
        raise TenantError(f"role must be one of {Membership.Role.values}, got {role!r}")
    membership = _membership_locked(tenant=tenant, username=username)
    if membership.role == role:
        return membership
    if role != Membership.Role.MANAGER:
        _refuse_last_manager(membership, doing="demoted")
    before = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit.record(
        actor=actor,
        action="membership.set",
        target=membership,
        tenant=tenant,
        before={"role": before},
        after={"user": username, "role": role},
    )
    return membership


@transaction.atomic
def member_remove(*, tenant: Tenant, username: str, actor: AbstractBaseUser | None) -> None:
    """Take a member off ``tenant``: the membership goes and the account is deactivated (it
    belonged to the team and can no longer sign in). The last manager stays."""
    membership = _membership_locked(tenant=tenant, username=username)
    _refuse_last_manager(membership, doing="removed")
    user = membership.user
    role = membership.role
    membership.delete()
    user.is_active = False
    user._audit_actor = actor
    user.save(update_fields=["is_active"])
    audit.record(
        actor=actor,
        action="membership.remove",
        object_type="tenants.membership",
        object_id=user.pk,
        tenant=tenant,
        before={"user": username, "role": role},
        after=None,
    )


def notifications_read(*, tenant: Tenant, now=None) -> int:
    """Mark the tenant's unread notifications read; returns how many."""
    from django.utils import timezone

    from tenants.models import Notification

    return Notification.objects.filter(tenant=tenant, read_at__isnull=True).update(
        read_at=now or timezone.now()
    )
