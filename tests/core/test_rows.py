"""rows_update: each row gets its own values, in one statement per PG_ROWS rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import core.rows
from core.rows import rows_update
from market.models import Bid
from market.services import bid_place
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def test_every_row_gets_its_own_values_and_no_other_row_changes(monkeypatch):
    market = market_make()
    tenant = factories.tenant(credits=10**9)
    user = factories.member(tenant=tenant)
    bids = [
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            now=T0,
            quantity=1,
            limits={"a100": 1000 + i},
        )
        for i in range(5)
    ]
    untouched = bids.pop()
    when = datetime(2030, 1, 1, tzinfo=UTC)
    for i, bid in enumerate(bids):
        bid.status = "lost" if i % 2 else "won"
        bid.outcome_reason = f"reason {i} with 'quotes', commas and {{braces}}"
        bid.updated_at = when + timedelta(minutes=i)
        bid.escrow = i
    monkeypatch.setattr(core.rows, "PG_ROWS", 3)  # two statements for four rows
    with CaptureQueriesContext(connection) as captured:
        rows_update(bids, ["status", "outcome_reason", "updated_at", "escrow"])
    assert len(captured.captured_queries) == 2
    for i, bid in enumerate(bids):
        row = Bid.objects.get(pk=bid.pk)
        assert (row.status, row.outcome_reason, row.updated_at, row.escrow) == (
            bid.status,
            bid.outcome_reason,
            bid.updated_at,
            i,
        )
    row = Bid.objects.get(pk=untouched.pk)
    assert (row.status, row.escrow) == ("open", untouched.escrow)
