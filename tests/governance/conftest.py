"""Fixtures for the governance tests: two admins, an auditor, two teams with managers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from market.services.policy import policy_active
from market.services.tiers import tier_create
from tenants.models import Membership
from tests import factories


@dataclass
class World:
    admin: object
    second_admin: object
    auditor: object
    vision: object
    speech: object
    vision_manager: object
    vision_researcher: object
    speech_manager: object
    tier: object


def auditor_user(username: str = "auditor"):
    user = get_user_model().objects.create_user(username=username, password="pw-audit-123")
    # The group comes from governance's migration, as on a real installation; a test run
    # with real transactions (workers, live servers) flushes the tables, the group with them.
    user.groups.add(Group.objects.get_or_create(name="auditor")[0])
    return user


@pytest.fixture
def world(db) -> World:
    admin = factories.admin_user(username="alice-admin")
    vision = factories.tenant(name="Vision Lab", credits=50_000_000, actor=admin)
    speech = factories.tenant(name="Speech Lab", credits=50_000_000, actor=admin)
    policy_active()
    return World(
        admin=admin,
        second_admin=factories.admin_user(username="bob-admin"),
        auditor=auditor_user(),
        vision=vision,
        speech=speech,
        vision_manager=factories.member(
            tenant=vision, username="vera-manager", role=Membership.Role.MANAGER
        ),
        vision_researcher=factories.member(tenant=vision, username="rita-researcher"),
        speech_manager=factories.member(
            tenant=speech, username="sam-manager", role=Membership.Role.MANAGER
        ),
        tier=tier_create(actor=admin, slug="a100", capacity=8),
    )


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client
