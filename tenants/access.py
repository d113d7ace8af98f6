"""Every tenant-owned row is fetched through the caller's tenant.

Another tenant's row and a missing row answer the same way (404), so ids leak nothing.
"""

from __future__ import annotations

from typing import TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Model, QuerySet
from django.http import Http404

from tenants.models import Membership, Tenant

M = TypeVar("M", bound=Model)


def membership_of(user: AbstractBaseUser | AnonymousUser | None) -> Membership | None:
    if user is None or not user.is_authenticated:
        return None
    try:
        return user.membership  # type: ignore[union-attr]
    except Membership.DoesNotExist:
        return None


def tenant_of(user: AbstractBaseUser | AnonymousUser | None) -> Tenant | None:
    membership = membership_of(user)
    return membership.tenant if membership else None


def manager_tenant_of(user: AbstractBaseUser | AnonymousUser | None) -> Tenant | None:
    """The team ``user`` manages, or None (a researcher, or no team)."""
    membership = membership_of(user)
    return membership.tenant if membership is not None and membership.is_manager else None


def require_tenant(user: AbstractBaseUser | AnonymousUser | None) -> Tenant:
    tenant = tenant_of(user)
    if tenant is None:
        raise Http404("You are not a member of any tenant.")
    return tenant


def scoped(queryset: QuerySet[M], *, tenant: Tenant, field: str = "tenant") -> QuerySet[M]:
    """Restrict a queryset of tenant-owned rows to ``tenant``."""
    return queryset.filter(**{field: tenant})


def access_object(queryset: QuerySet[M], *, tenant: Tenant, pk: object, field: str = "tenant") -> M:
    """One tenant-owned row by primary key, or 404 if it is missing or another tenant's."""
    try:
        return scoped(queryset, tenant=tenant, field=field).get(pk=pk)
    except (queryset.model.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404(f"No {queryset.model._meta.verbose_name} {pk} here.") from exc
