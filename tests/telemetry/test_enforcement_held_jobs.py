"""A standing order's Slurm job that was requeued and held when its order lost has no
processes, so no sample shows it: the loop releases it when the order wins again and cancels
it when the order ends, from the suspend it carried out."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from audit.models import AuditEvent
from market.models import Order
from telemetry.api.views import directive_to_wire
from telemetry.models import EnforcementAction
from telemetry.services import enforce
from tests.telemetry.test_enforcement_orders import _ack, _report, _window, _work

pytestmark = pytest.mark.django_db

A = EnforcementAction.Action
JOB = "4242"


def _held(node, tier, team, order, now):
    """The order's job suspended (its window ended, the order won nothing) and, as the agent
    reports, requeued and held: no process is left on any GPU. Returns (first allocation,
    suspend, the time of that report)."""
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _report(node, {0: [{**_work(first, now), "slurm_job": JOB}]}, now)
    (suspend,) = enforce(now=now).issued
    assert (suspend.action, suspend.slurm_job) == (A.SUSPEND, JOB)
    later = now + timedelta(seconds=40)
    _report(node, {}, later, results=[_ack(suspend)])
    assert enforce(now=later).issued == []  # out of the round: it stays held
    return first, suspend, later


def test_a_held_job_is_released_once_when_its_order_wins_again(node, tier, team, order, now):
    first, suspend, later = _held(node, tier, team, order, now)
    won = later + timedelta(seconds=5)
    new = _window(team, tier, order, starts_at=won - timedelta(seconds=1))
    _report(node, {}, won)

    (resume,) = enforce(now=won).issued

    assert resume.action == A.RESUME
    assert (resume.node_id, resume.gpu_id, resume.pid, resume.slurm_job) == (
        suspend.node_id,
        suspend.gpu_id,
        suspend.pid,
        JOB,
    )
    assert resume.allocation_id == new.pk and resume.allocation_ref == first.pk
    assert f"order {order.pk} won allocation {new.pk}" in resume.reason
    assert AuditEvent.objects.filter(action="enforcement.resume", object_id=str(resume.pk)).exists()
    assert "slurm_reservation" not in directive_to_wire(resume)  # reservations are off
    with override_settings(GPUMARKET_SLURM_RESERVATIONS=True):
        assert directive_to_wire(resume)["slurm_reservation"] == f"gm-{new.pk}"
    # Idempotent: issued, then carried out, it is never sent again.
    assert enforce(now=won + timedelta(seconds=1)).issued == []
    done = won + timedelta(seconds=2)
    _report(node, {}, done, results=[_ack(resume)])
    assert enforce(now=done).issued == []


def test_a_failed_release_is_retried_after_the_retry_delay(node, tier, team, order, now, settings):
    _, _, later = _held(node, tier, team, order, now)
    won = later + timedelta(seconds=5)
    _window(team, tier, order, starts_at=won - timedelta(seconds=1))
    (resume,) = enforce(now=won).issued
    failed = {"id": resume.pk, "outcome": "failed", "detail": "scontrol release: refused"}
    _report(node, {}, won, results=[failed])

    assert enforce(now=won + timedelta(seconds=1)).issued == []
    retry = won + timedelta(seconds=settings.GPUMARKET_ENFORCE_RETRY_SECONDS + 1)
    (again,) = enforce(now=retry).issued
    assert (again.action, again.slurm_job) == (A.RESUME, JOB)
    assert enforce(now=retry).issued == []


@pytest.mark.parametrize("status", [Order.Status.DONE, Order.Status.EXHAUSTED])
def test_a_held_job_of_an_order_that_ended_is_cancelled(node, tier, team, order, now, status):
    _, suspend, later = _held(node, tier, team, order, now)
    Order.objects.filter(pk=order.pk).update(status=status)

    (cancel,) = enforce(now=later).issued

    assert (cancel.action, cancel.slurm_job, cancel.pid) == (A.TERMINATE, JOB, suspend.pid)
    assert f"order {order.pk} is {status}" in cancel.reason
    assert enforce(now=later).issued == []


def test_a_suspend_whose_job_ended_leaves_nothing_to_release(node, tier, team, order, now):
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _report(node, {0: [{**_work(first, now), "slurm_job": JOB}]}, now)
    (suspend,) = enforce(now=now).issued
    later = now + timedelta(seconds=40)
    gone = {"id": suspend.pk, "outcome": "gone", "detail": "job ended after SIGUSR1"}
    _report(node, {}, later, results=[gone])
    won = later + timedelta(seconds=5)
    _window(team, tier, order, starts_at=won - timedelta(seconds=1))

    assert enforce(now=won).issued == []


def test_a_held_job_seen_running_again_is_left_to_the_per_process_rules(
    node, tier, team, order, now
):
    first, _, later = _held(node, tier, team, order, now)
    won = later + timedelta(seconds=5)
    _window(team, tier, order, starts_at=won - timedelta(seconds=1))
    # Released by someone else: its (new) process runs on the order's new window.
    _report(node, {0: [{**_work(first, won), "pid": 101, "slurm_job": JOB}]}, won)

    assert enforce(now=won).issued == []


def test_a_failed_suspend_of_another_process_of_the_job_does_not_delay_the_release(
    node, tier, team, order, now
):
    # A job of several processes gets a suspend for each; once the first requeued it, Slurm
    # refuses the others ("Job is pending execution").
    first, suspend, later = _held(node, tier, team, order, now)
    other = EnforcementAction.objects.create(
        node=node,
        gpu=suspend.gpu,
        pid=suspend.pid + 1,
        allocation=first,
        allocation_ref=first.pk,
        slurm_job=JOB,
        action=A.SUSPEND,
        reason="test",
        state=EnforcementAction.State.FAILED,
        created_at=later,
        acknowledged_at=later,
    )
    won = later + timedelta(seconds=5)
    _window(team, tier, order, starts_at=won - timedelta(seconds=1))

    (resume,) = enforce(now=won).issued

    assert resume.action == A.RESUME and resume.pk > other.pk
