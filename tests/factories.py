"""Test data made through the services, so factories never bypass the ledger or the audit."""

from __future__ import annotations

import itertools

from django.contrib.auth import get_user_model

from tenants.ledger import credits_grant
from tenants.models import Membership, Tenant
from tenants.services import member_add, tenant_create

_seq = itertools.count(1)


def admin_user(username: str = "") -> object:
    User = get_user_model()
    username = username or f"admin{next(_seq)}"
    return User.objects.create_user(
        username=username, password="pw-admin-123", is_staff=True, is_superuser=True
    )


def tenant(*, name: str = "", credits: int = 0, weight: int = 1, actor=None) -> Tenant:
    name = name or f"Team {next(_seq)}"
    t = tenant_create(name=name, actor=actor, weight=weight)
    if credits:
        credits_grant(tenant=t, amount=credits, reason="test grant", actor=actor)
    return t


def member(
    *,
    tenant: Tenant,
    username: str = "",
    role: str = Membership.Role.RESEARCHER,
    password: str = "pw-member-123",
):
    username = username or f"user{next(_seq)}"
    return member_add(
        tenant=tenant, username=username, role=role, actor=None, password=password
    ).user
