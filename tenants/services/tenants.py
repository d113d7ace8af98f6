"""Tenants and memberships."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils.text import slugify

import audit.services as audit
from tenants.errors import TenantError
from tenants.ledger import tenant_accounts_create
from tenants.models import Membership, Tenant


@transaction.atomic
def tenant_create(
    *, name: str, actor: AbstractBaseUser | None, weight: int = 1, slug: str = ""
) -> Tenant:
    name = (name or "").strip()
    if not name:
        raise TenantError("a tenant needs a name")
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise TenantError(f"weight must be a whole number >= 0, got {weight!r}")
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
