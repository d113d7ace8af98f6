"""Standing orders through /api/v1/orders: credits as strings, GPU-hours as numbers, refusals
naming the field, another tenant's order a 404, and the order's current allocation."""

from __future__ import annotations

import secrets

import pytest

from market.models import Bid, Order
from tests.api.world import TIER

pytestmark = pytest.mark.django_db

BODY = {"name": "sweep", "values": {TIER: "2.5"}, "gpus": 1, "gpu_hours": 3.5, "ceiling": "40"}


def test_create_list_retrieve_in_credits_and_hours(world):
    api = world.a.client()
    response = api.post("/api/v1/orders", BODY | {"restart_minutes": 10}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    order = Order.objects.get(pk=body["id"])
    assert (order.gpu_seconds_wanted, order.ceiling, order.restart_seconds) == (12_600, 40_000, 600)
    assert body["values"] == {TIER: "2.500"}
    assert (body["gpu_hours_wanted"], body["gpu_hours"], body["ceiling"]) == (3.5, 0.0, "40.000")
    assert body["status"] == "active" and body["restart_minutes"] == 10
    assert set(body["foresight"]) >= {"win_rate", "eta", "eta_reason", "needed_value"}
    assert Bid.objects.filter(order=order, round=world.open_round).exists()

    listed = api.get("/api/v1/orders").json()
    assert [o["id"] for o in listed["results"]] == [order.pk, world.a.order.pk]
    assert api.get(f"/api/v1/orders/{order.pk}").json()["name"] == "sweep"
    paused = api.get("/api/v1/orders?status=paused").json()["results"]
    assert [o["id"] for o in paused] == [world.a.order.pk]


def test_until_cancelled_is_null_hours(world):
    api = world.a.client()
    body = api.post("/api/v1/orders", BODY | {"gpu_hours": None}, format="json").json()
    assert body["gpu_hours_wanted"] is None
    assert body["foresight"]["eta_reason"] == "it runs until cancelled"


def test_refusals_name_the_field(world):
    api = world.a.client()
    bad = api.post("/api/v1/orders", BODY | {"ceiling": 40}, format="json")
    assert bad.status_code == 400 and "ceiling" in bad.json()["error"]["fields"]
    hours = api.post("/api/v1/orders", BODY | {"gpu_hours": "3"}, format="json")
    assert hours.status_code == 400 and "gpu_hours" in hours.json()["error"]["fields"]
    # Well-formed, but below one window at the value: the service says no, naming the field.
    low = api.post("/api/v1/orders", BODY | {"ceiling": "0.001"}, format="json")
    assert low.status_code == 409
    assert list(low.json()["error"]["fields"]) == ["ceiling"]
    assert low.json()["error"]["message"].startswith("ceiling:")
    tier = api.post("/api/v1/orders", BODY | {"values": {"nope": "1"}}, format="json")
    assert tier.status_code == 409 and "values" in tier.json()["error"]["fields"]
    assert Order.objects.count() == 2  # the world's own


def test_edit_pause_resume_cancel(world):
    api = world.a.client()
    order = api.post("/api/v1/orders", BODY, format="json").json()
    url = f"/api/v1/orders/{order['id']}"
    edited = api.patch(url, {"values": {TIER: "3"}, "gpu_hours": None}, format="json").json()
    assert edited["values"] == {TIER: "3.000"} and edited["gpu_hours_wanted"] is None
    assert edited["ceiling"] == "40.000"
    refused = api.patch(url, {"restart_minutes": 100_000}, format="json")
    assert refused.status_code == 400 and "restart_minutes" in refused.json()["error"]["fields"]
    assert api.post(f"{url}/pause").json()["status"] == "paused"
    assert api.post(f"{url}/resume").json()["status"] == "active"
    assert api.post(f"{url}/cancel").json()["status"] == "cancelled"
    again = api.post(f"{url}/resume")
    assert again.status_code == 409 and "cannot be resumed" in again.json()["error"]["message"]
    assert api.get(url).json()["foresight"]["eta_reason"] == "the order is cancelled"


def test_another_tenants_order_is_a_404(world):
    order = world.a.client().post("/api/v1/orders", BODY, format="json").json()
    other = world.b.client()
    url = f"/api/v1/orders/{order['id']}"
    assert other.get(url).status_code == 404
    assert other.patch(url, {"name": "mine"}, format="json").status_code == 404
    for verb in ("pause", "resume", "cancel"):
        assert other.post(f"{url}/{verb}").status_code == 404
    assert other.get(f"{url}/allocation").status_code == 404
    assert [o["id"] for o in other.get("/api/v1/orders").json()["results"]] == [world.b.order.pk]
    assert Order.objects.get(pk=order["id"]).status == "active"


def test_the_orders_current_allocation_on_a_node(world):
    api = world.a.client()
    order = api.post("/api/v1/orders", BODY, format="json").json()
    url = f"/api/v1/orders/{order['id']}/allocation"
    none = api.get(url)
    assert none.status_code == 404 and "holds no GPUs" in none.json()["error"]["message"]
    # The settled allocation running now stands for one the order won.
    allocation = world.a.allocation
    Bid.objects.filter(pk=allocation.bid_id).update(order_id=order["id"])
    allocation.placement = [{"node": "node-1", "index": 2, "uuid": "GPU-2"}]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    assert api.get(url).json()["id"] == allocation.pk
    assert api.get(url, {"node": "node-1"}).json()["id"] == allocation.pk
    assert api.get(url, {"node": "node-9"}).status_code == 404


def test_a_retried_create_with_its_idempotency_key_makes_one_order(world):
    api = world.a.client()
    headers = {"HTTP_IDEMPOTENCY_KEY": "sweep-2026-11-28"}
    first = api.post("/api/v1/orders", BODY, format="json", **headers)
    again = api.post("/api/v1/orders", BODY, format="json", **headers)
    assert first.status_code == 201 and again.status_code in (200, 201)
    assert again.json()["id"] == first.json()["id"]
    assert Order.objects.filter(name="sweep").count() == 1
    assert Bid.objects.filter(order_id=first.json()["id"]).count() == 1
    other = api.post("/api/v1/orders", BODY | {"name": "other"}, format="json", **headers)
    assert other.status_code == 409 and "idempotency_key" in other.json()["error"]["message"]


def test_an_order_created_preemptible_says_so(world):
    api = world.a.client()
    body = api.post("/api/v1/orders", BODY | {"preemptible": True}, format="json").json()
    assert body["preemptible"] is True
    assert Order.objects.get(pk=body["id"]).preemptible
    plain = api.post("/api/v1/orders", BODY | {"name": "plain"}, format="json").json()
    assert plain["preemptible"] is False
    bad = api.post("/api/v1/orders", BODY | {"preemptible": "sometimes"}, format="json")
    assert bad.status_code == 400 and "preemptible" in bad.json()["error"]["fields"]
