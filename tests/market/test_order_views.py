"""Standing order pages through the Django test client: create, list, detail with rounds and
foresight, edit, pause, resume, cancel; refusals next to their field; other tenants' 404."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from market.models import Bid, Order, Round
from market.services.orders.lifecycle import order_create
from market.services.tick import rounds_tick
from tests import factories
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db


def _post(**overrides):
    data = {
        "name": "resnet sweep",
        "value_a100": "3",
        "value_h100": "",
        "gpus": "2",
        "min_gpus": "",
        "gpu_hours": "10",
        "ceiling": "100",
        "deadline": "",
        "restart_minutes": "5",
        "campaign": "",
        "command": "python train.py",
        "slurm_job": "",
    }
    data.update(overrides)
    return data


def _order(team, **terms):
    tenant, user = team
    fields = {"name": "sweep", "values": {"a100": 3000}, "gpus": 2, "ceiling": 100_000}
    return order_create(user=user, tenant=tenant, **(fields | terms))


def test_order_new_creates_an_order_in_credits_and_hours(client, market, team):
    tenant, user = team
    client.force_login(user)
    assert reverse("order_list") in client.get(reverse("order_list")).content.decode()
    response = client.post(reverse("order_new"), _post())
    order = Order.objects.get(tenant=tenant)
    assert response.status_code == 302
    assert response.url == reverse("order_detail", args=[order.pk])
    assert (order.gpus, order.min_gpus, order.gpu_seconds_wanted) == (2, 2, 36_000)
    assert (order.ceiling, order.restart_seconds, order.command) == (
        100_000,
        300,
        "python train.py",
    )
    assert dict(order.limits.values_list("tier__slug", "price")) == {"a100": 3000}
    assert Bid.objects.filter(order=order, round=market.round).exists()

    page = client.get(reverse("order_list")).content.decode()
    assert "resnet sweep" in page and "0.00 / 10.00" in page and "0.000 / 100.000" in page
    detail = client.get(reverse("order_detail", args=[order.pk])).content.decode()
    assert "0.00 received of 10.00 wanted" in detail
    assert "a100 ≤ 3.000 credits/GPU-h" in detail
    assert "gpumarket run --order" in detail


def test_order_new_until_cancelled_and_elastic(client, market, team):
    tenant, user = team
    client.force_login(user)
    client.post(reverse("order_new"), _post(gpu_hours="", min_gpus="1", gpus="3"))
    order = Order.objects.get(tenant=tenant)
    assert (order.gpu_seconds_wanted, order.min_gpus, order.gpus) == (None, 1, 3)
    assert "until cancelled" in client.get(reverse("order_list")).content.decode()
    assert not order.preemptible


def test_order_new_can_take_backfilled_gpus(client, market, team):
    tenant, user = team
    client.force_login(user)
    client.post(reverse("order_new"), _post(preemptible="on"))
    order = Order.objects.get(tenant=tenant)
    assert order.preemptible
    detail = client.get(reverse("order_detail", args=[order.pk])).content.decode()
    assert "also takes GPUs backfilled within a window" in detail


def test_a_service_refusal_shows_next_to_the_field_it_names(client, market, team):
    _, user = team
    client.force_login(user)
    response = client.post(reverse("order_new"), _post(ceiling="3"))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "ceiling" in errors
    assert "does not cover one window" in errors["ceiling"][0]
    none = client.post(reverse("order_new"), _post(value_a100=""))
    assert none.status_code == 400
    assert "at least one tier" in none.content.decode()
    assert not Order.objects.exists()


def test_another_tenants_order_is_a_404(client, market, team, rival):
    order = _order(team)
    _, stranger = rival
    client.force_login(stranger)
    for name in ("order_detail", "order_edit"):
        assert client.get(reverse(name, args=[order.pk])).status_code == 404
    for name in ("order_pause", "order_resume", "order_cancel"):
        assert client.post(reverse(name, args=[order.pk]), {"confirm": "1"}).status_code == 404
    assert "sweep" not in client.get(reverse("order_list")).content.decode()
    order.refresh_from_db()
    assert order.status == Order.Status.ACTIVE


def test_pause_resume_and_cancel_by_post(client, market, team):
    order = _order(team)
    client.force_login(team[1])
    detail = reverse("order_detail", args=[order.pk])
    assert client.get(reverse("order_pause", args=[order.pk])).status_code == 405
    assert client.post(reverse("order_pause", args=[order.pk])).url == detail
    order.refresh_from_db()
    assert order.status == Order.Status.PAUSED
    assert not Bid.objects.filter(order=order, status=Bid.Status.OPEN).exists()
    assert "resume-order" in client.get(detail).content.decode()
    client.post(reverse("order_resume", args=[order.pk]))
    order.refresh_from_db()
    assert order.status == Order.Status.ACTIVE
    # Cancel asks first, then acts.
    ask = client.post(reverse("order_cancel", args=[order.pk]))
    assert ask.status_code == 200 and "cannot be resumed" in ask.content.decode()
    client.post(reverse("order_cancel", args=[order.pk]), {"confirm": "1"})
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    # An ended order cannot be resumed: the refusal comes back as a message.
    page = client.post(reverse("order_resume", args=[order.pk]), follow=True)
    assert "it cannot be resumed" in page.content.decode()


def test_edit_changes_the_values_and_keeps_the_rest(client, market, team):
    order = _order(team, gpu_seconds_wanted=7200)
    client.force_login(team[1])
    form = client.get(reverse("order_edit", args=[order.pk]))
    assert form.status_code == 200 and 'value="3"' in form.content.decode()
    data = _post(name="sweep", value_a100="2.5", value_h100="4", gpus="2", min_gpus="2")
    data["gpu_hours"] = "2"
    response = client.post(reverse("order_edit", args=[order.pk]), data)
    assert response.status_code == 302
    order.refresh_from_db()
    assert dict(order.limits.values_list("tier__slug", "price")) == {"a100": 2500, "h100": 4000}
    assert order.gpu_seconds_wanted == 7200
    refused = client.post(reverse("order_edit", args=[order.pk]), data | {"ceiling": "1"})
    assert refused.status_code == 400 and "ceiling" in refused.context["form"].errors


def test_detail_shows_each_rounds_outcome_and_the_foresight(client, market, team):
    order = _order(team, gpu_seconds_wanted=20 * 3600, deadline=T0 + timedelta(days=3), now=T0)
    for _ in range(2):
        report = rounds_tick(now=market.round.closes_at + timedelta(seconds=1))
        market.round = Round.objects.get(pk=report.open_round)
    order.refresh_from_db()
    assert order.rounds_won >= 1
    client.force_login(team[1])
    page = client.get(reverse("order_detail", args=[order.pk])).content.decode()
    won = Bid.objects.filter(order=order, status=Bid.Status.WON).first()
    assert won.outcome_reason and won.outcome_reason in page
    assert f"{order.rounds_won} won, {order.rounds_lost} lost" in page
    assert "% of the last" in page
    assert "credits/GPU-h to finish by" in page
    listing = client.get(reverse("order_list")).content.decode()
    assert "UTC" in listing  # an ETA, not a reason


def test_a_manager_sees_the_teams_orders(client, market, team):
    from tenants.models import Membership

    order = _order(team)
    manager = factories.member(tenant=team[0], role=Membership.Role.MANAGER)
    client.force_login(manager)
    assert client.get(reverse("order_detail", args=[order.pk])).status_code == 200
