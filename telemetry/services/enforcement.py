"""The enforcement loop: desired state (allocations, budgets) against observed state (the
processes in each GPU's latest sample); differences become EnforcementActions, which are the
directives the node agents carry out.

Rules, per observed process:
- pid 0, the processes of a GPU its sample did not list (more than 256), running without the
  allocation and launch token of a listed running process: pause, which the agent carries out
  as a sweep of that GPU over its own full process list (docs/telemetry-protocol.md);
- no allocation tag, or a tag naming no allocation: pause;
- its allocation's window has ended, or it was finished, preempted or revoked: terminate
  (SIGTERM, then SIGKILL after GPUMARKET_PREEMPT_GRACE_SECONDS); unless the allocation is a
  standing order's (verdicts.py): then the work runs on as the order's allocation of the
  window it won on these GPUs, runs on while the order's next bid is being cleared, is
  suspended (checkpoint signal, the grace, then stopped with its GPUs released) when the
  order lost or is paused, and is terminated only when the order ended or runs elsewhere;
- its allocation has not started, or is paused by the market: pause;
- on a GPU of another tier than its allocation's: pause;
- its tenant has reached a hard spend cap: pause;
- its allocation is placed (settlement bound it to GPUs) and the process's launch token does
  not verify for it on this node, or it runs on a GPU not placed for it: pause;
- it runs on a GPU placed for another allocation: pause;
- its allocation's processes occupy more GPUs than it won: pause the processes on the extra
  GPUs (the GPUs it runs on are kept first, then the lowest GPU ids);
- otherwise it may run: a process this loop paused or suspended is resumed.

And per Slurm job that a suspend requeued and held (it has no processes, so no sample shows
it; held_jobs.py): when its order has a live allocation again it is resumed (released, into
the allocation's Slurm reservation when there is one); when the order ended it is cancelled.

Idempotent: an action is issued only when the process's *expected* state (what it is, or
will be once pending directives are carried out) differs from what is wanted. A failed
directive is retried after GPUMARKET_ENFORCE_RETRY_SECONDS, not on every tick.

The allocations' status follows (through the market's allocation services, in the pass's
transaction): a hard-capped tenant's running allocations become ``paused`` and go back to
``active`` once the cap is gone; an allocation whose ended window still had work to terminate
becomes ``preempted``. A pause the loop did not make (its audit event is not the enforcer's)
is never undone here.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

import audit.services as audit
from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Allocation
from market.services.allocations import allocations_pause, allocations_preempt, allocations_resume
from market.services.bids import tenant_bids_cancel
from market.services.cap_refunds import allocations_cap_recharge, allocations_cap_refund
from telemetry.models import EnforcementAction, Node, ProcessObservation
from telemetry.services.held_jobs import held_jobs
from telemetry.services.notices import (
    window_ended_notify,
    work_paused_notify,
    work_resumed_notify,
)
from telemetry.services.verdicts import RUN, Verdict, cap_reason, decide, verdicts
from tenants.budgets import budget_alerts_raise, tenant_hard_capped
from tenants.ledger import credits
from tenants.models import Budget, Tenant

logger = logging.getLogger(__name__)

Action = EnforcementAction.Action
State = EnforcementAction.State

# Any fixed 64-bit key: only one enforcement pass at a time (two would issue twice).
_ENFORCE_LOCK_KEY = 7_412_002
_ENFORCER = "enforcer"


@dataclass
class EnforceReport:
    issued: list[EnforcementAction] = field(default_factory=list)
    capped_tenants: list[int] = field(default_factory=list)
    bids_cancelled: int = 0
    skipped: bool = False  # another pass held the lock
    # Allocation ids whose status this pass changed.
    allocations_paused: list[int] = field(default_factory=list)
    allocations_resumed: list[int] = field(default_factory=list)
    allocations_preempted: list[int] = field(default_factory=list)


def enforce(*, now: datetime | None = None) -> EnforceReport:
    """One pass of the loop: raise budget alerts, apply hard caps, issue directives."""
    now = now or timezone.now()
    capped = spend_caps_apply(now=now)
    report = directives_issue(now=now, capped=capped)
    report.capped_tenants = sorted(capped)
    report.bids_cancelled = _open_bids_cancel(tenants=capped)
    return report


def spend_caps_apply(*, now: datetime) -> dict[int, Budget]:
    """Raise soft alerts (50/80/100 %) for every tenant with a budget; return the tenants at a
    hard cap now, with the budget that caps them."""
    capped: dict[int, Budget] = {}
    tenant_ids = Budget.objects.filter(active=True).values_list("tenant_id", flat=True).distinct()
    for tenant in Tenant.objects.filter(pk__in=tenant_ids).order_by("pk"):
        budget_alerts_raise(tenant=tenant, at=now)
        budget = tenant_hard_capped(tenant=tenant, at=now)
        if budget is not None:
            capped[tenant.pk] = budget
    return capped


def _open_bids_cancel(*, tenants: dict[int, Budget]) -> int:
    """Cancel the open bids of hard-capped tenants (the market releases their escrow)."""
    cancelled = 0
    for tenant in Tenant.objects.filter(pk__in=tenants).order_by("pk"):
        budget = tenants[tenant.pk]
        cancelled += len(
            tenant_bids_cancel(
                tenant=tenant,
                reason=f"hard spend cap of {credits(budget.cap)} credits reached",
                actor=_ENFORCER,
            )
        )
    return cancelled


def _lock() -> bool:
    if connection.vendor != "postgresql":
        return True  # SQLite serialises writers already
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_ENFORCE_LOCK_KEY])
        return bool(cursor.fetchone()[0])


# How strict a wanted state is, for a process whose GPUs call for different ones.
_STRICTNESS = {Action.TERMINATE: 3, Action.SUSPEND: 2, Action.PAUSE: 1, RUN: 0}


@transaction.atomic
def directives_issue(*, now: datetime, capped: dict[int, Budget]) -> EnforceReport:
    """Compare wanted and expected state of every freshly observed process; issue actions."""
    if not _lock():
        return EnforceReport(skipped=True)
    report = EnforceReport()
    # Before the verdicts: a cap lifted this pass must read `active` again, or the
    # allocation's own status would keep its work paused.
    _allocations_follow_caps(report=report, capped=capped, now=now)
    fresh_after = now - timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS)
    observations = list(
        ProcessObservation.objects.filter(
            node__healthy=True, node__revoked_at__isnull=True, seen_at__gte=fresh_after
        )
        .select_related("gpu", "node")
        .order_by("gpu_id", "pid")
    )
    retry_after = timedelta(seconds=settings.GPUMARKET_ENFORCE_RETRY_SECONDS)
    for held in held_jobs(
        now=now,
        retry_after=retry_after,
        observed={(o.node_id, o.slurm_job) for o in observations if o.slurm_job},
    ):
        report.issued.append(
            _issue(observation=held.suspend, verdict=held.verdict, action=held.action, now=now)
        )
    if not observations:
        return report
    latest = _latest_actions(observations)
    by_gpu = {(o.gpu_id, o.pid): latest.get((o.node_id, o.pid)) for o in observations}
    wanted = verdicts(observations=observations, latest=by_gpu, capped=capped, now=now)
    # A process is signalled as a whole, so one that uses several GPUs gets one directive:
    # the strictest its GPUs call for (terminate, then pause), named on the first such GPU.
    processes: dict[tuple[int, int], list[ProcessObservation]] = defaultdict(list)
    for observation in observations:
        processes[(observation.node_id, observation.pid)].append(observation)
    for key, seen in processes.items():
        observation = min(seen, key=lambda o: (-_STRICTNESS[wanted[o.pk].want], o.gpu_id))
        verdict = wanted[observation.pk]
        action = decide(
            want=verdict.want,
            observation=observation,
            last=latest.get(key),
            now=now,
            retry_after=retry_after,
        )
        if action is not None:
            report.issued.append(
                _issue(observation=observation, verdict=verdict, action=action, now=now)
            )
    _allocations_preempt(report=report, verdicts=wanted.values(), now=now)
    return report


def _allocations_follow_caps(
    *, report: EnforceReport, capped: dict[int, Budget], now: datetime
) -> None:
    """A hard-capped tenant's running allocations read ``paused``; the ones this loop paused
    read ``active`` again once their tenant is no longer capped."""
    running = Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
    to_pause: dict[Tenant, list[int]] = defaultdict(list)
    for allocation in (
        running.filter(tenant_id__in=capped, status=Allocation.Status.ACTIVE)
        .select_related("tenant")
        .order_by("tenant_id", "pk")
    ):
        to_pause[allocation.tenant].append(allocation.pk)
    for tenant, ids in to_pause.items():
        paused_now = _status_move(
            allocations_pause,
            ids=ids,
            reason=cap_reason(tenant, capped[tenant.pk]),
            now=now,
        )
        report.allocations_paused += paused_now
        # In the same transaction as the pause: what never ran is not paid for.
        allocations_cap_refund(
            allocation_ids=paused_now, never_ran=_never_ran(paused_now), actor=_ENFORCER, now=now
        )
        work_paused_notify(
            paused=list(Allocation.objects.filter(pk__in=paused_now).order_by("pk")),
            reason=cap_reason(tenant, capped[tenant.pk]),
            now=now,
        )
    paused = running.filter(status=Allocation.Status.PAUSED).exclude(tenant_id__in=capped)
    to_resume = allocations_cap_recharge(
        allocation_ids=_paused_by_enforcer(list(paused.values_list("pk", flat=True))),
        actor=_ENFORCER,
        now=now,
    )
    resumed = _status_move(
        allocations_resume,
        ids=to_resume,
        reason="the tenant's hard spend cap no longer applies (raised, or its window rolled over)",
        now=now,
    )
    report.allocations_resumed += resumed
    if resumed:
        work_resumed_notify(
            resumed=list(Allocation.objects.filter(pk__in=resumed).order_by("pk")), now=now
        )


def _never_ran(ids: list[int]) -> set[int]:
    """Of these allocations, the ones no work was ever seen on: no process observed with
    their tag now, and no enforcement action ever taken on their work."""
    seen = set(
        ProcessObservation.objects.filter(allocation_ref__in=ids).values_list(
            "allocation_ref", flat=True
        )
    ) | set(
        EnforcementAction.objects.filter(allocation_id__in=ids).values_list(
            "allocation_id", flat=True
        )
    )
    return set(ids) - seen


def _paused_by_enforcer(ids: list[int]) -> list[int]:
    """Of these paused allocations, the ones whose latest pause was this loop's (for a cap);
    one paused by an admin stays paused whatever the tenant's budget says."""
    if not ids:
        return []
    last = (
        AuditEvent.objects.filter(
            object_type=Allocation._meta.label_lower,
            object_id__in=[str(pk) for pk in ids],
            action="allocation.pause",
        )
        .values("object_id")
        .annotate(last=Max("seq"))
        .values_list("last", flat=True)
    )
    mine = AuditEvent.objects.filter(
        seq__in=list(last), actor__isnull=True, actor_label=_ENFORCER
    ).values_list("object_id", flat=True)
    return sorted(int(pk) for pk in mine)


def _allocations_preempt(
    *, report: EnforceReport, verdicts: Iterable[Verdict], now: datetime
) -> None:
    """An allocation still active or paused whose ended window had work to terminate was
    preempted. (One `round_finish` reached first is `finished` and stays so.)"""
    verdicts = list(verdicts)
    ids = sorted(
        {
            v.allocation.pk
            for v in verdicts
            if v.want in (Action.TERMINATE, Action.SUSPEND)
            and v.allocation is not None
            and v.allocation.status in (Allocation.Status.ACTIVE, Allocation.Status.PAUSED)
            and v.allocation.ends_at <= now
        }
    )
    ended = _status_move(
        allocations_preempt,
        ids=ids,
        reason="the window ended with work still running, which is terminated (or, a standing "
        "order's, suspended) after a "
        f"{settings.GPUMARKET_PREEMPT_GRACE_SECONDS}s grace to checkpoint",
        now=now,
    )
    report.allocations_preempted += ended
    if ended:
        window_ended_notify(
            ended=list(
                Allocation.objects.filter(pk__in=ended).select_related("bid").order_by("pk")
            ),
            grace_seconds=settings.GPUMARKET_PREEMPT_GRACE_SECONDS,
            suspended=frozenset(
                v.allocation.pk
                for v in verdicts
                if v.want == Action.SUSPEND and v.allocation is not None
            ),
        )


def _status_move(
    service: Callable[..., list[Allocation]], *, ids: list[int], reason: str, now: datetime
) -> list[int]:
    """Call one allocation status service; a refusal (another path ended or revoked an
    allocation since it was read) is logged and the next pass reads the new state."""
    if not ids:
        return []
    try:
        return [a.pk for a in service(allocation_ids=ids, reason=reason, actor=_ENFORCER, now=now)]
    except MarketError as exc:
        logger.warning("enforcement: allocation status of %s left as it is: %s", ids, exc)
        return []


def _latest_actions(
    observations: list[ProcessObservation],
) -> dict[tuple[int, int], EnforcementAction]:
    """The last action about each observed process: {(node id, pid): action}, whichever of its
    GPUs it named."""
    last_ids = (
        EnforcementAction.objects.filter(
            node_id__in={o.node_id for o in observations}, pid__in={o.pid for o in observations}
        )
        .values("node_id", "pid")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    return {(a.node_id, a.pid): a for a in EnforcementAction.objects.filter(pk__in=list(last_ids))}


def _issue(
    *,
    observation: ProcessObservation | EnforcementAction,
    verdict: Verdict,
    action: str,
    now: datetime,
) -> EnforcementAction:
    """Issue and audit ``action`` on the observed process, or on the process and Slurm job an
    earlier directive named (a held job has no process to observe)."""
    node: Node = observation.node
    grace = (
        settings.GPUMARKET_PREEMPT_GRACE_SECONDS
        if action in (Action.TERMINATE, Action.SUSPEND)
        else 0
    )
    reason = verdict.reason if action != Action.RESUME else f"allowed again: {verdict.reason}"
    created = EnforcementAction.objects.create(
        node=node,
        gpu=observation.gpu,
        pid=observation.pid,
        allocation=verdict.allocation,
        allocation_ref=observation.allocation_ref,
        tenant=verdict.tenant,
        slurm_job=observation.slurm_job,
        pod=observation.pod,
        action=action,
        reason=reason[:300],
        grace_seconds=grace,
        created_at=now,
    )
    audit.record(
        actor="enforcer",
        action=f"enforcement.{action}",
        target=created,
        tenant=verdict.tenant,
        after={
            "node": node.name,
            "gpu": observation.gpu.uuid,
            "pid": observation.pid,
            "allocation": observation.allocation_ref,
            "reason": created.reason,
            "grace_seconds": grace,
        },
    )
    logger.info(
        "enforcement: %s pid %d on %s: %s", action, observation.pid, observation.gpu.uuid, reason
    )
    return created
