"""Allocation usage and fleet pages: scoping, staff-only fleet, simulated nodes labelled."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation, Bid, PolicyVersion, Round
from telemetry.models import Gpu, ProcessObservation, Sample
from telemetry.services import node_register, tier_capacity_refresh
from tests import factories
from tests.telemetry.market_data import fleet_node

pytestmark = pytest.mark.django_db


def _allocation(tenant, user, tier) -> Allocation:
    """A running allocation, written directly: these tests are about reading it back."""
    now = timezone.now()
    policy = PolicyVersion.objects.create(number=1, status=PolicyVersion.Status.ACTIVE)
    rnd = Round.objects.create(
        policy=policy,
        status=Round.Status.SETTLED,
        opens_at=now - timedelta(hours=2),
        closes_at=now - timedelta(hours=1),
        starts_at=now - timedelta(minutes=30),
        ends_at=now + timedelta(minutes=30),
    )
    bid = Bid.objects.create(
        tenant=tenant, author=user, round=rnd, quantity=1, status=Bid.Status.WON
    )
    return Allocation.objects.create(
        tenant=tenant,
        round=rnd,
        bid=bid,
        tier=tier,
        gpus=1,
        price=1000,
        charge=1000,
        starts_at=rnd.starts_at,
        ends_at=rnd.ends_at,
    )


@pytest.fixture
def running(tier):
    tenant = factories.tenant(name="Vision Lab")
    user = factories.member(tenant=tenant)
    allocation = _allocation(tenant, user, tier)
    node, _token = node_register(name="sim-1", tier=tier, actor="test")
    node.simulated = True
    node.save(update_fields=["simulated"])
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-sim-0", index=0, name="Sim A100", tier=tier, memory_total_mib=81920
    )
    now = timezone.now()
    Sample.objects.bulk_create(
        Sample(
            gpu=gpu,
            at=now - timedelta(minutes=m),
            utilization_pct=70.0 + m,
            memory_used_mib=1000,
            memory_total_mib=81920,
            power_w=300,
            temperature_c=60,
            energy_j=1e6,
        )
        for m in range(3)
    )
    ProcessObservation.objects.create(
        node=node,
        gpu=gpu,
        pid=4242,
        memory_mib=1000,
        allocation_ref=allocation.pk,
        state=ProcessObservation.State.RUNNING,
        at=now,
        seen_at=now,
    )
    return tenant, user, allocation


def test_allocation_detail_shows_utilisation_chart(client, running):
    _tenant, user, allocation = running
    client.force_login(user)
    response = client.get(reverse("allocation_detail", args=[allocation.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="allocation-utilisation"' in body
    assert "sim-1/0 (simulated)" in body


def test_live_panel_reports_latest_utilisation(client, running):
    _tenant, user, _allocation = running
    client.force_login(user)
    body = client.get(reverse("allocations_live")).content.decode()
    assert "70% on 1 GPU" in body


def test_other_tenant_gets_404_and_empty_lists(client, running):
    _tenant, _user, allocation = running
    rival = factories.member(tenant=factories.tenant(name="Speech Lab"))
    client.force_login(rival)
    assert client.get(reverse("allocation_detail", args=[allocation.pk])).status_code == 404
    for name in ("allocation_list", "allocations_live"):
        body = client.get(reverse(name)).content.decode()
        assert reverse("allocation_detail", args=[allocation.pk]) not in body


def test_fleet_is_staff_only_and_labels_simulated_nodes(client, running):
    _tenant, user, _ = running
    client.force_login(user)
    assert client.get(reverse("fleet")).status_code == 403
    assert client.get(reverse("enforcement_list")).status_code == 403
    client.force_login(factories.admin_user())
    body = client.get(reverse("fleet")).content.decode()
    assert 'id="gpu-heatmap"' in body
    assert "simulated" in body
    assert client.get(reverse("enforcement_list")).status_code == 200


@pytest.fixture
def fleet_gpus(tier):
    """Two healthy GPUs on a healthy node: the tier's capacity is 2."""
    node, _token = node_register(name="n1", tier=tier, actor="test")
    node.healthy = True
    node.save(update_fields=["healthy"])
    gpus = [
        Gpu.objects.create(
            node=node, uuid=f"GPU-{i}", index=i, name="A100", tier=tier, memory_total_mib=81920
        )
        for i in range(2)
    ]
    tier_capacity_refresh(tiers=[tier], actor="test")
    tier.refresh_from_db()
    assert tier.capacity == 2
    return gpus


def test_staff_puts_a_gpu_in_maintenance_and_back_from_the_fleet_page(client, tier, fleet_gpus):
    gpu = fleet_gpus[0]
    admin = factories.admin_user()
    client.force_login(admin)
    url = reverse("gpu_maintenance", args=[gpu.pk])
    page = client.get(reverse("fleet")).content.decode()
    assert f'action="{url}"' in page
    assert "Put in maintenance" in page

    response = client.post(url, {"maintenance": "on"}, follow=True)
    assert response.redirect_chain == [(reverse("fleet"), 302)]
    gpu.refresh_from_db()
    tier.refresh_from_db()
    assert gpu.maintenance is True
    assert (tier.capacity, tier.offered) == (1, 1)
    body = response.content.decode()
    assert "n1/0 is in maintenance; tier a100 now offers 1 GPU(s)" in body
    assert "Return to service" in body
    event = AuditEvent.objects.get(action="gpu.maintenance")
    assert event.after == {"maintenance": True}
    assert event.actor == admin

    client.post(url, {"maintenance": "on"})  # a second submit of the same state changes nothing
    assert AuditEvent.objects.filter(action="gpu.maintenance").count() == 1

    client.post(url, {"maintenance": "off"})
    gpu.refresh_from_db()
    tier.refresh_from_db()
    assert gpu.maintenance is False
    assert (tier.capacity, tier.offered) == (2, 2)
    assert AuditEvent.objects.filter(action="gpu.maintenance").count() == 2


def test_gpu_maintenance_refuses_researchers_gets_and_bad_input(client, tier, fleet_gpus):
    gpu = fleet_gpus[0]
    url = reverse("gpu_maintenance", args=[gpu.pk])
    client.force_login(factories.member(tenant=factories.tenant(name="Vision Lab")))
    assert client.post(url, {"maintenance": "on"}).status_code == 403

    client.force_login(factories.admin_user())
    assert client.get(url).status_code == 405
    assert (
        client.post(
            reverse("gpu_maintenance", args=[gpu.pk + 100]), {"maintenance": "on"}
        ).status_code
        == 404
    )
    response = client.post(url, {"maintenance": "yes"})
    assert response.status_code == 400
    assert "maintenance must be 'on' or 'off'" in response.content.decode()

    gpu.refresh_from_db()
    tier.refresh_from_db()
    assert gpu.maintenance is False
    assert tier.capacity == 2
    assert not AuditEvent.objects.filter(action="gpu.maintenance").exists()


def test_allocation_page_shows_its_placement_and_ready_command(client, running):
    _tenant, user, allocation = running
    client.force_login(user)
    body = client.get(reverse("allocation_detail", args=[allocation.pk])).content.decode()
    assert "no GPUs were placed" in body and "GPUMARKET_ALLOCATION=" in body
    assert "gpumarket run" not in body

    allocation.placement = [{"node": "sim-1", "index": 0, "uuid": "GPU-sim-0"}]
    allocation.launch_secret = "k" * 64
    allocation.save()
    body = client.get(reverse("allocation_detail", args=[allocation.pk])).content.decode()
    assert "sim-1 GPU 0" in body
    assert f"gpumarket run --allocation {allocation.pk} --node sim-1 -- python train.py" in body
    assert "k" * 64 not in body


def test_fleet_shows_topology_and_the_largest_gang_still_placeable(client, tier):
    fleet_node(name="n1", tier=tier)
    tenant = factories.tenant(name="Vision Lab")
    allocation = _allocation(tenant, factories.member(tenant=tenant), tier)
    allocation.placement = [{"node": "n1", "index": 0, "uuid": "GPU-n1-0"}]
    allocation.save()
    client.force_login(factories.admin_user())
    body = client.get(reverse("fleet")).content.decode()
    assert "nvl2" in body and "pcie2" in body
    row = body.split('id="fragmentation"')[1].split("</table>")[0]
    # Four GPUs, one placed: three free, all on n1, at most two in one NVLink domain.
    cells = [c.split("</td>")[0] for c in row.split("<td>")[1:6]]
    assert cells == [tier.slug, "4", "3", "3", "2"]
