"""What the enforcement loop wants for each observed process, and whether a directive is
needed to get there (the rules are listed in telemetry/services/enforcement.py). Reads only:
the loop issues what ``decide`` returns."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from market.models import Allocation
from market.placement.launch import launch_token_valid
from market.services.launch import placement_text
from telemetry.models import EnforcementAction, ProcessObservation
from tenants.ledger import credits
from tenants.models import Budget, Tenant

Action = EnforcementAction.Action
State = EnforcementAction.State

RUN = "run"
STOPPED = ProcessObservation.State.STOPPED
RUNNING = ProcessObservation.State.RUNNING
TERMINATING = "terminating"

_EFFECT = {Action.PAUSE: STOPPED, Action.RESUME: RUNNING, Action.TERMINATE: TERMINATING}
_ENDED = (Allocation.Status.FINISHED, Allocation.Status.PREEMPTED, Allocation.Status.REVOKED)


@dataclass(frozen=True)
class Verdict:
    want: str  # RUN, Action.PAUSE or Action.TERMINATE
    reason: str
    allocation: Allocation | None = None
    tenant: Tenant | None = None


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
    if want == Action.PAUSE:
        if expected == STOPPED:
            return None
        if last is not None and last.action == Action.PAUSE and recently_failed:
            return None
        return Action.PAUSE
    # The process may run. Resume it only if this loop stopped it: a process its owner
    # stopped (a debugger, a job-control stop) is none of the platform's business.
    if expected != STOPPED or last is None:
        return None
    if last.action == Action.PAUSE and last.state in (
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
        a.pk: a for a in Allocation.objects.filter(pk__in=refs).select_related("tenant", "tier")
    }
    placed_for = _gpus_placed_now(now)
    verdicts: dict[int, Verdict] = {}
    # allocation id -> gpu id -> observations allowed so far (before the GPU-count rule)
    candidates: dict[int, dict[int, list[ProcessObservation]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for o in observations:
        verdict = _verdict_alone(o, allocations.get(o.allocation_ref), capped=capped, now=now)
        if verdict.want == RUN:
            verdict = _verdict_placed(o, verdict, placed_for)
        verdicts[o.pk] = verdict
        if verdict.want == RUN:
            candidates[verdict.allocation.pk][o.gpu_id].append(o)  # type: ignore[union-attr]
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


def _gpus_placed_now(now: datetime) -> dict[str, int]:
    """{GPU uuid: allocation id} of the live allocations placed on GPUs now."""
    rows = (
        Allocation.objects.filter(
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            starts_at__lte=now,
            ends_at__gt=now,
        )
        .exclude(placement=[])
        .values_list("pk", "placement")
    )
    return {gpu["uuid"]: pk for pk, placement in rows for gpu in placement}


def _verdict_placed(o: ProcessObservation, verdict: Verdict, placed_for: dict[str, int]) -> Verdict:
    """Work that may run by its allocation's status runs only where placement put it: a
    placed allocation's work must carry the launch token for this node and run on its GPUs;
    no work runs on a GPU placed for another allocation."""
    allocation = verdict.allocation
    assert allocation is not None
    pk, tenant, where = allocation.pk, allocation.tenant, f"{o.node.name}/{o.gpu.index}"
    if allocation.placement:
        here = [g["uuid"] for g in allocation.placement if g["node"] == o.node.name]
        if not launch_token_valid(
            o.launch_token or None,
            secret=allocation.launch_secret,
            allocation_id=pk,
            node=o.node.name,
            uuids=here,
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
    now: datetime,
) -> Verdict:
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
        return Verdict(
            Action.TERMINATE,
            f"allocation {allocation.pk} {ended}; preempted with "
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
