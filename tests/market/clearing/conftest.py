"""The clearing package is pure Python: its tests need no database, broker or Django."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _require_postgresql() -> None:
    """Overrides the suite-wide PostgreSQL check: nothing here touches a database."""
