"""The staff enforcement page filters by action, state, node and tenant; a bad filter value is
a form error on the page, never a 500."""

from __future__ import annotations

import pytest
from django.utils import timezone

from telemetry.services import enforce, node_register, samples_ingest
from tests import factories
from tests.telemetry.batches import batch, process

pytestmark = pytest.mark.django_db


@pytest.fixture
def actions(tier):
    a, _ = node_register(name="node-a", tier=tier, actor="test")
    b, _ = node_register(name="node-b", tier=tier, actor="test")
    samples_ingest(node=a, payload=batch(node="node-a", gpus=1, processes={0: [process(11)]}))
    samples_ingest(node=b, payload=batch(node="node-b", gpus=1, processes={0: [process(22)]}))
    enforce(now=timezone.now())
    return a, b


def _rows(client, query: str) -> str:
    response = client.get(f"/fleet/enforcement/?{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_the_enforcement_page_filters_by_node_action_and_state(client, actions):
    a, b = actions
    client.force_login(factories.admin_user())
    everything = _rows(client, "")
    assert "pid 11" in everything and "pid 22" in everything
    only_b = _rows(client, f"node={b.pk}")
    assert "pid 22" in only_b and "pid 11" not in only_b
    paused = _rows(client, "action=pause&state=issued")
    assert "pid 11" in paused and "pid 22" in paused
    assert "pid 11" not in _rows(client, "action=resume")
    assert "No enforcement actions." in _rows(client, "state=failed")


@pytest.mark.parametrize("query", ["node=abc", "action=explode", "tenant=-1", "state=" + "x" * 500])
def test_a_bad_filter_is_an_inline_error_not_a_500(client, actions, query):
    client.force_login(factories.admin_user())
    response = client.get(f"/fleet/enforcement/?{query}")
    assert response.status_code == 400
    assert "errorlist" in response.content.decode()
