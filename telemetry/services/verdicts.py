"""What the enforcement loop wants for each observed process, and whether a directive is
needed to get there (the rules are listed in telemetry/services/enforcement.py). Reads only:
the loop issues what ``decide`` returns."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings

from market.models import Allocation, Bid
from market.placement.launch import launch_token_valid
from market.services.launch import placement_text
from market.services.reclaim import reclaimed_gpus
from telemetry.models import EnforcementAction, ProcessObservation
from telemetry.payload.reports import MAX_PROCESSES_PER_SAMPLE
from tenants.ledger import credits
from tenants.models import Budget, Tenant

Action = EnforcementAction.Action
State = EnforcementAction.State

RUN = "run"
STOPPED = ProcessObservation.State.STOPPED
RUNNING = ProcessObservation.State.RUNNING
TERMINATING = "terminating"
# The observation that stands for the processes a GPU's sample did not list one by one
# (telemetry/payload/parse.py); a pause of it is the agent's sweep of that GPU.
UNREPORTED_PID = 0

_EFFECT = {
    Action.PAUSE: STOPPED,
    Action.RESUME: RUNNING,
    Action.TERMINATE: TERMINATING,
    Action.SUSPEND: STOPPED,
}
# Actions that leave a process stopped by this loop, which it may resume.
_STOPS = (Action.PAUSE, Action.SUSPEND)
_ENDED = (Allocation.Status.FINISHED, Allocation.Status.PREEMPTED, Allocation.Status.REVOKED)


@dataclass(frozen=True)
class Verdict:
    want: str  # RUN, Action.PAUSE, Action.SUSPEND or Action.TERMINATE
    reason: str
    allocation: Allocation | None = None
    tenant: Tenant | None = None
    # The allocation the process was started for, when ``allocation`` is its standing
    # order's allocation of a later window (the work runs on across windows it wins): its
    # launch token is checked against the one it was started for.
    started_for: Allocation | None = None


@dataclass(frozen=True)
class Orders:
    """What the verdicts need of the standing orders behind the observed allocations."""

    # order id -> its live allocations now (active or paused, window around now)
    live: dict[int, list[Allocation]]
    # (order id, window start) for each bid of an order not yet settled
    pending: set[tuple[int, datetime]]


def expected_state(observation: ProcessObservation, last: EnforcementAction | None) -> str:
    """What the process is, or will be once the directive last sent about it is carried out.

    An outcome and the first sample taken after it arrive in the same batch, so an
    observation received no earlier than the outcome already shows its effect.
    """
    if last is None:
        return observation.state
    if last.pending or (
        last.state == State.ACKNOWLEDGED and observation.seen_at < last.acknowledged_at
    ):
        return _EFFECT[last.action]
    if last.action == Action.TERMINATE and last.state == State.ACKNOWLEDGED:
        return TERMINATING
    return observation.state


def decide(
    *,
    want: str,
    observation: ProcessObservation,
    last: EnforcementAction | None,
    now: datetime,
    retry_after: timedelta,
) -> str | None:
    expected = expected_state(observation, last)
    if expected == TERMINATING:
        return None
    recently_failed = (
        last is not None
        and last.state == State.FAILED
        and last.acknowledged_at is not None
        and now - last.acknowledged_at < retry_after
    )
    if want == Action.TERMINATE:
        if (
            last is not None
            and last.action == Action.TERMINATE
            and (last.state != State.FAILED or recently_failed)
        ):
            return None
        return Action.TERMINATE
    if want in _STOPS:
        if expected == STOPPED:
            return None
        if last is not None and last.action == want and recently_failed:
            return None
        return want
    # The process may run. Resume it only if this loop stopped it: a process its owner
    # stopped (a debugger, a job-control stop) is none of the platform's business.
    if expected != STOPPED or last is None:
        return None
    if last.action in _STOPS and last.state in (
        State.ISSUED,
        State.DELIVERED,
        State.ACKNOWLEDGED,
    ):
        return Action.RESUME
    if last.action == Action.RESUME and last.state == State.FAILED and not recently_failed:
        return Action.RESUME
    return None


def verdicts(
    *,
    observations: list[ProcessObservation],
    latest: dict[tuple[int, int], EnforcementAction],
    capped: dict[int, Budget],
    now: datetime,
) -> dict[int, Verdict]:
    refs = {o.allocation_ref for o in observations if o.allocation_ref is not None}
    allocations = {
        a.pk: a
        for a in Allocation.objects.filter(pk__in=refs).select_related(
            "tenant", "tier", "bid__order"
        )
    }
    orders = _orders(allocations.values(), now=now)
    reclaimed = reclaimed_gpus(now=now)
    placed_for = _gpus_placed_now(now, reclaimed=reclaimed)
    verdicts: dict[int, Verdict] = {}
    # allocation id -> gpu id -> observations allowed so far (before the GPU-count rule)
    candidates: dict[int, dict[int, list[ProcessObservation]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for o in observations:
        verdict = _verdict_alone(
            o, allocations.get(o.allocation_ref), capped=capped, orders=orders, now=now
        )
        if verdict.want == RUN:
            verdict = _verdict_placed(o, verdict, placed_for)
        if verdict.want == RUN:
            verdict = _verdict_reclaimed(o, verdict, reclaimed)
        verdicts[o.pk] = verdict
        if verdict.want == RUN:
            assert verdict.allocation is not None
            allocations.setdefault(verdict.allocation.pk, verdict.allocation)  # a later window
            candidates[verdict.allocation.pk][o.gpu_id].append(o)
    for allocation_id, by_gpu in candidates.items():
        allocation = allocations[allocation_id]
        if len(by_gpu) <= allocation.gpus:
            continue

        def keep_first(
            gpu_id: int, by_gpu: dict[int, list[ProcessObservation]] = by_gpu
        ) -> tuple[int, int]:
            running = any(
                expected_state(o, latest.get((o.gpu_id, o.pid))) == RUNNING for o in by_gpu[gpu_id]
            )
            return (0 if running else 1, gpu_id)

        for gpu_id in sorted(by_gpu, key=keep_first)[allocation.gpus :]:
            for o in by_gpu[gpu_id]:
                verdicts[o.pk] = Verdict(
                    Action.PAUSE,
                    f"allocation {allocation.pk} won {allocation.gpus} GPU(s) and its work "
                    f"runs on {len(by_gpu)}; work on the extra GPUs is paused",
                    allocation,
                    allocation.tenant,
                )
    return verdicts


def _orders(allocations: Iterable[Allocation], *, now: datetime) -> Orders:
    order_ids = {a.bid.order_id for a in allocations if a.bid.order_id is not None}
    if not order_ids:
        return Orders(live={}, pending=set())
    live: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in (
        Allocation.objects.filter(
            bid__order_id__in=order_ids,
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            starts_at__lte=now,
            ends_at__gt=now,
        )
        .select_related("tenant", "tier", "bid__order")
        .order_by("pk")
    ):
        live[allocation.bid.order_id].append(allocation)
    pending = set(
        Bid.objects.filter(order_id__in=order_ids, status=Bid.Status.OPEN).values_list(
            "order_id", "round__starts_at"
        )
    )
    return Orders(live=dict(live), pending=pending)


def _continuation(
    o: ProcessObservation, allocation: Allocation, orders: Orders
) -> Allocation | None:
    """The live allocation of the same standing order that this process runs on: placed on
    its GPU, or (not placed) on its GPU's tier."""
    for later in orders.live.get(allocation.bid.order_id, []):
        if later.placement:
            if any(g["uuid"] == o.gpu.uuid for g in later.placement):
                return later
        elif later.tier_id == o.gpu.tier_id:
            return later
    return None


def _order_ended_verdict(
    o: ProcessObservation, allocation: Allocation, *, orders: Orders, ended: str
) -> Verdict | None:
    """Work of a standing order whose window ended: None when it is not an order's (the
    plain rule applies); otherwise the order's next window decides. It runs on while the
    order's bid for the next window is being cleared; it is suspended when the order lost
    (or was paused), terminated when the order ended or now runs on other GPUs."""
    order = allocation.bid.order
    if order is None:
        return None
    pk, tenant, grace = allocation.pk, allocation.tenant, settings.GPUMARKET_PREEMPT_GRACE_SECONDS
    if (order.pk, allocation.ends_at) in orders.pending and order.live:
        return Verdict(
            RUN,
            f"allocation {pk} {ended}; order {order.pk}'s bid for the next window is being "
            "cleared, and its work runs on meanwhile",
            allocation,
            tenant,
        )
    elsewhere = orders.live.get(order.pk)
    if elsewhere:
        return Verdict(
            Action.TERMINATE,
            f"order {order.pk} now runs on allocation {elsewhere[0].pk} on other GPUs; this "
            f"copy gets {grace}s to checkpoint, then stops, and `gpumarket run --order "
            f"{order.pk}` starts it there",
            allocation,
            tenant,
        )
    if order.live:
        why = "is paused" if order.status == order.Status.PAUSED else "did not win this window"
        return Verdict(
            Action.SUSPEND,
            f"allocation {pk} {ended} and order {order.pk} {why}: checkpoint signal "
            f"({settings.GPUMARKET_CHECKPOINT_SIGNAL}), {grace}s, then suspended with its GPUs "
            "released; it resumes when the order wins again",
            allocation,
            tenant,
        )
    return Verdict(
        Action.TERMINATE,
        f"allocation {pk} {ended} and order {order.pk} is {order.status}"
        f"{': ' + order.status_reason if order.status_reason else ''}; stopped after {grace}s "
        "to checkpoint",
        allocation,
        tenant,
    )


def _verdict_reclaimed(
    o: ProcessObservation, verdict: Verdict, reclaimed: dict[str, int]
) -> Verdict:
    """Work of an allocation on a GPU reclaimed from it (idle, refunded) is paused: the GPU is
    the platform's until the window ends (market/services/reclaim.py)."""
    allocation = verdict.allocation
    assert allocation is not None
    if reclaimed.get(o.gpu.uuid) != allocation.pk:
        return verdict
    return Verdict(
        Action.PAUSE,
        f"GPU {o.node.name}/{o.gpu.index} was reclaimed from allocation {allocation.pk} after "
        "it stayed idle (its unused time was refunded); it is not the allocation's until the "
        "window ends",
        allocation,
        allocation.tenant,
    )


def _gpus_placed_now(now: datetime, *, reclaimed: dict[str, int] | None = None) -> dict[str, int]:
    """{GPU uuid: allocation id} of the live allocations placed on GPUs now, less the GPUs
    reclaimed from them."""
    reclaimed = reclaimed or {}
    rows = (
        Allocation.objects.filter(
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            starts_at__lte=now,
            ends_at__gt=now,
        )
        .exclude(placement=[])
        .values_list("pk", "placement")
    )
    return {
        gpu["uuid"]: pk
        for pk, placement in rows
        for gpu in placement
        if reclaimed.get(gpu["uuid"]) != pk
    }


def _verdict_placed(o: ProcessObservation, verdict: Verdict, placed_for: dict[str, int]) -> Verdict:
    """Work that may run by its allocation's status runs only where placement put it: a
    placed allocation's work must carry the launch token for this node and run on its GPUs;
    no work runs on a GPU placed for another allocation."""
    allocation = verdict.allocation
    assert allocation is not None
    pk, tenant, where = allocation.pk, allocation.tenant, f"{o.node.name}/{o.gpu.index}"
    started = verdict.started_for or allocation
    if allocation.placement:
        here = [g["uuid"] for g in allocation.placement if g["node"] == o.node.name]
        if not launch_token_valid(
            o.launch_token or None,
            secret=started.launch_secret,
            allocation_id=started.pk,
            node=o.node.name,
            uuids=[g["uuid"] for g in started.placement if g["node"] == o.node.name],
        ):
            why = (
                "carries no launch token"
                if not o.launch_token
                else f"its launch token is not the one for it on {o.node.name}"
            )
            return Verdict(
                Action.PAUSE,
                f"the process claims allocation {pk} but {why}; start work with "
                f"`gpumarket run --allocation {pk}`",
                allocation,
                tenant,
            )
        if o.gpu.uuid not in here:
            return Verdict(
                Action.PAUSE,
                f"allocation {pk} is placed on {placement_text(allocation)}; this GPU "
                f"({where}) is not one of them",
                allocation,
                tenant,
            )
        return verdict
    other = placed_for.get(o.gpu.uuid)
    if other is not None and other != pk:
        return Verdict(
            Action.PAUSE,
            f"GPU {where} is placed for allocation {other}, not {pk}",
            allocation,
            tenant,
        )
    return verdict


def _verdict_alone(
    o: ProcessObservation,
    allocation: Allocation | None,
    *,
    capped: dict[int, Budget],
    orders: Orders,
    now: datetime,
) -> Verdict:
    if o.pid == UNREPORTED_PID:
        # The agent's aggregate of the processes it did not list: running means some of them
        # share no running listed process's allocation and launch token.
        return Verdict(
            Action.PAUSE,
            f"processes beyond the {MAX_PROCESSES_PER_SAMPLE} the agent lists on this GPU run "
            "without the allocation and launch token of listed, running work; all are paused",
        )
    if o.allocation_ref is None:
        return Verdict(
            Action.PAUSE,
            "the process has no allocation (no GPUMARKET_ALLOCATION tag); GPUs run allocated work only",
        )
    if allocation is None:
        return Verdict(
            Action.PAUSE,
            f"allocation {o.allocation_ref} does not exist; the process is paused until it does",
        )
    tenant = allocation.tenant
    if allocation.status in _ENDED or allocation.ends_at <= now:
        ended = (
            f"was {allocation.status}"
            if allocation.status in _ENDED
            else f"ended at {allocation.ends_at:%Y-%m-%d %H:%M:%S} UTC"
        )
        if allocation.bid.order_id:
            later = _continuation(o, allocation, orders)
            if later is not None:
                verdict = _verdict_alone(o, later, capped=capped, orders=orders, now=now)
                return replace(verdict, started_for=allocation)
            verdict = _order_ended_verdict(o, allocation, orders=orders, ended=ended)
            if verdict is not None:
                return verdict
        return Verdict(
            Action.TERMINATE,
            f"allocation {allocation.pk} {ended}; its work is stopped after "
            f"{settings.GPUMARKET_PREEMPT_GRACE_SECONDS}s to checkpoint",
            allocation,
            tenant,
        )
    if allocation.starts_at > now:
        return Verdict(
            Action.PAUSE,
            f"allocation {allocation.pk} starts at {allocation.starts_at:%Y-%m-%d %H:%M:%S} UTC",
            allocation,
            tenant,
        )
    budget = capped.get(tenant.pk)
    # A capped tenant's allocation is `paused` because of the cap: the cap, below, is the
    # reason to give, as it was before the status followed it.
    paused_by_cap = allocation.status == Allocation.Status.PAUSED and budget is not None
    if allocation.status != Allocation.Status.ACTIVE and not paused_by_cap:
        return Verdict(
            Action.PAUSE, f"allocation {allocation.pk} is {allocation.status}", allocation, tenant
        )
    if allocation.tier_id != o.gpu.tier_id:
        return Verdict(
            Action.PAUSE,
            f"allocation {allocation.pk} is for tier {allocation.tier.slug}; this GPU is in "
            "another tier",
            allocation,
            tenant,
        )
    if budget is not None:
        return Verdict(Action.PAUSE, cap_reason(tenant, budget), allocation, tenant)
    return Verdict(
        RUN,
        f"allocation {allocation.pk} is active, within its GPUs and its tenant's budget",
        allocation,
        tenant,
    )


def cap_reason(tenant: Tenant, budget: Budget) -> str:
    scope = budget.campaign.name if budget.campaign_id else budget.get_window_display().lower()
    return (
        f"{tenant.name} reached its {scope} hard cap of {credits(budget.cap)} credits; work "
        "resumes when the window rolls over or the cap is raised"
    )
