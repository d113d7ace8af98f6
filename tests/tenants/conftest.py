from __future__ import annotations

import pytest

from tenants.models import Membership
from tests import factories


@pytest.fixture
def lab(db):
    """A tenant with a manager and a researcher: (tenant, manager, researcher)."""
    tenant = factories.tenant(name="Vision Lab", credits=100_000)
    manager = factories.member(tenant=tenant, role=Membership.Role.MANAGER)
    researcher = factories.member(tenant=tenant)
    return tenant, manager, researcher
