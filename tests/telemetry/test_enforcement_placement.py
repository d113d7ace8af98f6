"""Enforcement follows placement, and an allocation tag cannot be stolen (issue 11 item 4).

Before placement, anyone on a node could set GPUMARKET_ALLOCATION to another team's allocation
and run on its GPUs and bill, and the owner's own job was paused as the "extra" one. Now a
placed allocation's work runs only with a launch token that verifies for this node and only
on the GPUs placed for it, and nothing else runs on those GPUs."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import Allocation
from market.placement.launch import launch_token
from market.services.launch import allocation_launch
from telemetry.models import EnforcementAction
from telemetry.services import enforce, node_register, samples_ingest
from tenants.ledger import MILLI
from tests import factories
from tests.telemetry.batches import batch, gpu_uuid, process
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db

A = EnforcementAction.Action


@pytest.fixture
def node(tier):
    node, _ = node_register(name="n1", tier=tier, actor="test")
    return node


@pytest.fixture
def now():
    return timezone.now()


def _placed(tenant, tier, now, indices):
    """An active allocation placed on GPUs ``indices`` of node n1, as settlement leaves it."""
    allocation = allocation_make(
        tenant=tenant,
        tier=tier,
        gpus=len(indices),
        starts_at=now - timedelta(minutes=10),
        ends_at=now + timedelta(minutes=50),
    )
    allocation.placement = [{"node": "n1", "index": i, "uuid": gpu_uuid("n1", i)} for i in indices]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    return allocation


def _token(allocation, now):
    return allocation_launch(allocation=allocation, node="n1", now=now).token


def _report(node, processes, now):
    samples_ingest(node=node, payload=batch(gpus=4, processes=processes, at=now))


def _pauses(now):
    return {a.pid: a.reason for a in enforce(now=now).issued if a.action == A.PAUSE}


@pytest.fixture
def teams():
    return (
        factories.tenant(name="Vision", credits=1_000 * MILLI),
        factories.tenant(name="Speech", credits=1_000 * MILLI),
    )


def test_a_stolen_tag_is_paused_and_the_owners_job_keeps_running(node, tier, teams, now):
    owner, _thief = teams
    allocation = _placed(owner, tier, now, [2])
    token = _token(allocation, now)
    _report(
        node,
        {
            # Another team's process sets GPUMARKET_ALLOCATION to the owner's allocation, on
            # a lower GPU: the GPU-count rule alone kept it and paused the owner's job.
            0: [process(200, allocation=allocation.pk)],
            2: [process(100, allocation=allocation.pk, launch_token=token)],
        },
        now,
    )
    pauses = _pauses(now)
    assert set(pauses) == {200}
    assert "carries no launch token" in pauses[200] and "gpumarket run" in pauses[200]


def test_a_token_for_another_allocation_or_node_does_not_verify(node, tier, teams, now):
    owner, thief = teams
    allocation = _placed(owner, tier, now, [0, 1])
    theirs = _placed(thief, tier, now, [2])
    forged = launch_token(
        secret=allocation.launch_secret, allocation_id=allocation.pk, node="n9", uuids=["x"]
    )
    _report(
        node,
        {
            0: [process(100, allocation=allocation.pk, launch_token=_token(theirs, now))],
            1: [process(101, allocation=allocation.pk, launch_token=forged)],
        },
        now,
    )
    pauses = _pauses(now)
    assert set(pauses) == {100, 101}
    assert all("its launch token is not the one for it on n1" in r for r in pauses.values())
    assert all(f"claims allocation {allocation.pk}" in r for r in pauses.values())


def test_work_of_an_allocation_on_a_gpu_not_placed_for_it_is_paused(node, tier, teams, now):
    allocation = _placed(teams[0], tier, now, [0, 1])
    token = _token(allocation, now)
    _report(
        node,
        {
            1: [process(101, allocation=allocation.pk, launch_token=token)],
            3: [process(103, allocation=allocation.pk, launch_token=token)],
        },
        now,
    )
    pauses = _pauses(now)
    assert set(pauses) == {103}
    assert "placed on n1 GPUs 0, 1; this GPU (n1/3) is not one of them" in pauses[103]


def test_no_other_work_runs_on_a_gpu_placed_for_another_team(node, tier, teams, now):
    owner, other = teams
    _placed(owner, tier, now, [0])
    # An allocation from before placement (no GPUs bound) may run anywhere else in its tier,
    # but not on a GPU placed for someone else.
    unplaced = allocation_make(
        tenant=other,
        tier=tier,
        gpus=2,
        starts_at=now - timedelta(minutes=10),
        ends_at=now + timedelta(minutes=50),
    )
    _report(
        node,
        {0: [process(300, allocation=unplaced.pk)], 3: [process(303, allocation=unplaced.pk)]},
        now,
    )
    pauses = _pauses(now)
    assert set(pauses) == {300}
    assert "GPU n1/0 is placed for allocation" in pauses[300]


def test_properly_launched_work_runs_and_a_rerun_issues_nothing(node, tier, teams, now):
    allocation = _placed(teams[0], tier, now, [0, 1])
    token = _token(allocation, now)
    _report(
        node,
        {
            0: [process(100, allocation=allocation.pk, launch_token=token)],
            1: [process(100, allocation=allocation.pk, launch_token=token)],
        },
        now,
    )
    assert enforce(now=now).issued == []
    assert enforce(now=now + timedelta(seconds=5)).issued == []


def test_a_process_on_several_gpus_gets_one_directive_the_strictest(node, tier, teams, now):
    allocation = _placed(teams[0], tier, now, [0, 1])
    token = _token(allocation, now)
    # One process on its two GPUs and on GPU 3, which is not placed for it.
    on = {i: [process(100, allocation=allocation.pk, launch_token=token)] for i in (0, 1, 3)}
    _report(node, on, now)
    (pause,) = enforce(now=now).issued
    assert (pause.action, pause.pid, pause.gpu.index) == (A.PAUSE, 100, 3)
    assert "this GPU (n1/3) is not one of them" in pause.reason
    assert enforce(now=now + timedelta(seconds=1)).issued == []

    # Its window ends: one terminate for the process, not one per GPU.
    Allocation.objects.filter(pk=allocation.pk).update(ends_at=now + timedelta(seconds=2))
    later = now + timedelta(seconds=3)
    _report(node, {i: on[i] for i in (0, 1)}, later)
    (terminate,) = enforce(now=later).issued
    assert (terminate.action, terminate.pid) == (A.TERMINATE, 100)
