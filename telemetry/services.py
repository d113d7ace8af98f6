"""Every telemetry write: nodes and their tokens, ingest, tier capacity, node health, rollups.

The enforcement loop lives in telemetry/enforcement.py and is re-exported here (``enforce``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Avg, Case, Count, Max, Value, When
from django.db.models.functions import TruncMinute
from django.utils import timezone

import audit.services as audit
from market.models import Tier
from market.services import tier_capacity_set
from telemetry.enforcement import EnforceReport, enforce
from telemetry.errors import TelemetryError
from telemetry.models import (
    EnforcementAction,
    Gpu,
    IngestBatch,
    Node,
    ProcessObservation,
    Sample,
    SampleMinute,
)
from telemetry.payload import BatchReport, Limits, payload_parse

__all__ = [
    "EnforceReport",
    "IngestResult",
    "RollupResult",
    "enforce",
    "gpu_maintenance_set",
    "node_authenticate",
    "node_register",
    "node_token_revoke",
    "nodes_health_check",
    "samples_ingest",
    "samples_rollup",
    "tier_capacity_refresh",
]

TOKEN_SCHEME = "gmn_"
_PREFIX_LENGTH = 12  # hex characters


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Nodes and tokens


@transaction.atomic
def node_register(
    *, name: str, tier: Tier, actor: AbstractBaseUser | str | None
) -> tuple[Node, str]:
    """Register a node whose discovered GPUs join ``tier``. Returns the node and its token.

    The token is shown to the caller once and stored only as a SHA-256 hash: whoever loses
    it revokes the node's token and registers the node again.
    """
    name = (name or "").strip()
    if not name or len(name) > 120:
        raise TelemetryError("a node needs a name of 1 to 120 characters")
    if Node.objects.filter(name=name).exists():
        raise TelemetryError(f"a node named {name!r} is already registered; pick another name")
    prefix = secrets.token_hex(_PREFIX_LENGTH // 2)
    token = f"{TOKEN_SCHEME}{prefix}_{secrets.token_urlsafe(32)}"
    node = Node.objects.create(
        name=name, tier=tier, token_prefix=prefix, token_hash=_token_hash(token)
    )
    audit.record(
        actor=actor,
        action="node.register",
        target=node,
        after={"name": name, "tier": tier.slug, "token_prefix": prefix},
    )
    return node, token


@transaction.atomic
def node_token_revoke(*, node: Node, actor: AbstractBaseUser | str | None) -> Node:
    """Refuse the node's token from now on; its GPUs leave their tier's capacity."""
    locked = Node.objects.select_for_update().get(pk=node.pk)
    if locked.revoked_at is not None:
        return locked
    locked.revoked_at = timezone.now()
    locked.healthy = False
    locked.save(update_fields=["revoked_at", "healthy"])
    tiers = _gpus_unhealthy(Gpu.objects.filter(node=locked))
    audit.record(
        actor=actor,
        action="node.token_revoke",
        target=locked,
        after={"revoked_at": locked.revoked_at.isoformat()},
    )
    tier_capacity_refresh(tiers=tiers)
    node.revoked_at, node.healthy = locked.revoked_at, False
    return locked


def node_authenticate(*, authorization: str) -> Node:
    """The node whose token is in an ``Authorization: Bearer <token>`` header (401 otherwise)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorised("send the node token as 'Authorization: Bearer <token>'")
    prefix = token[len(TOKEN_SCHEME) : len(TOKEN_SCHEME) + _PREFIX_LENGTH]
    node = None
    if token.startswith(TOKEN_SCHEME) and len(prefix) == _PREFIX_LENGTH:
        node = Node.objects.filter(token_prefix=prefix).first()
    # Compare even when no node matched, so timing does not tell a wrong prefix from a
    # wrong secret.
    expected = node.token_hash if node is not None else "0" * 64
    if not hmac.compare_digest(expected, _token_hash(token)) or node is None:
        raise _unauthorised("the node token is not valid")
    if node.revoked_at is not None:
        raise _unauthorised(
            f"the token of node {node.name!r} was revoked; register the node again for a new one"
        )
    return node


def _unauthorised(message: str) -> TelemetryError:
    return TelemetryError(message, errors={"authorization": [message]}, status=401)


# ---------------------------------------------------------------------------------------------
# Capacity and GPUs


def _gpus_unhealthy(gpus: Iterable[Gpu] | object) -> set[int]:
    """Mark GPUs unhealthy; return the ids of the tiers that lost healthy GPUs."""
    qs = gpus.filter(healthy=True)  # type: ignore[attr-defined]
    tiers = set(qs.values_list("tier_id", flat=True))
    qs.update(healthy=False)
    return tiers


def tier_capacity_refresh(
    *, tiers: Iterable[int | Tier] | None = None, actor: AbstractBaseUser | str | None = "telemetry"
) -> dict[str, int]:
    """Set each tier's capacity to its healthy GPUs not in maintenance, on healthy nodes.

    Only tiers with registered nodes are telemetry's; a tier without nodes keeps the capacity
    an admin set. Unchanged capacities are not written (nor audited). Returns {slug: capacity}.
    """
    if tiers is None:
        tier_ids = set(Node.objects.values_list("tier_id", flat=True)) | set(
            Gpu.objects.values_list("tier_id", flat=True)
        )
    else:
        tier_ids = {t.pk if isinstance(t, Tier) else t for t in tiers}
    counts = dict(
        Gpu.objects.filter(
            tier_id__in=tier_ids,
            healthy=True,
            maintenance=False,
            node__healthy=True,
            node__revoked_at__isnull=True,
        )
        .values_list("tier_id")
        .annotate(n=Count("id"))
    )
    result = {}
    for tier in Tier.objects.filter(pk__in=tier_ids).order_by("pk"):
        capacity = counts.get(tier.pk, 0)
        if tier.capacity != capacity:
            tier_capacity_set(tier=tier, capacity=capacity, actor=actor)
        result[tier.slug] = capacity
    return result


@transaction.atomic
def gpu_maintenance_set(
    *, gpu: Gpu, maintenance: bool, actor: AbstractBaseUser | str | None
) -> Gpu:
    """Take a GPU out of (or back into) its tier's capacity for the next rounds."""
    if not isinstance(maintenance, bool):
        raise TelemetryError(f"maintenance must be true or false, got {maintenance!r}")
    locked = Gpu.objects.select_for_update().get(pk=gpu.pk)
    if locked.maintenance == maintenance:
        return locked
    locked.maintenance = maintenance
    locked.save(update_fields=["maintenance"])
    audit.record(
        actor=actor,
        action="gpu.maintenance",
        target=locked,
        before={"maintenance": not maintenance},
        after={"maintenance": maintenance},
    )
    tier_capacity_refresh(tiers=[locked.tier_id])
    gpu.maintenance = maintenance
    return locked


# ---------------------------------------------------------------------------------------------
# Ingest


@dataclass(frozen=True)
class IngestResult:
    stored: int
    duplicate: bool
    # Directives for the node's agent, oldest first: pending ones are sent again until the
    # agent reports their outcome (the agent applies each id once).
    directives: list[EnforcementAction]


_OUTCOME_STATES = {
    "done": EnforcementAction.State.ACKNOWLEDGED,
    "gone": EnforcementAction.State.GONE,
    "failed": EnforcementAction.State.FAILED,
}
MAX_DIRECTIVES_PER_RESPONSE = 500


def samples_ingest(*, node: Node, payload: dict, now: datetime | None = None) -> IngestResult:
    """Validate and store one batch from ``node``'s agent; record directive outcomes; return
    the node's pending directives.

    A batch with any bad field is refused whole (TelemetryError with field errors) and
    nothing of it is stored. A batch id seen before is stored once: the retry gets
    ``duplicate=True`` and the directives, so an agent whose response was lost loses nothing.
    """
    now = now or timezone.now()
    report = payload_parse(payload, now=now, limits=Limits.from_settings())
    with transaction.atomic():
        return _ingest(node=node, report=report, now=now)


def _ingest(*, node: Node, report: BatchReport, now: datetime) -> IngestResult:
    # One node's batches are applied one at a time (an agent posts in order; this also
    # serialises a retry racing its original).
    node = Node.objects.select_for_update().select_related("tier").get(pk=node.pk)
    if node.revoked_at is not None:
        raise _unauthorised(f"the token of node {node.name!r} was revoked")
    known = {g.uuid: g for g in Gpu.objects.filter(uuid__in=[g.uuid for g in report.gpus])}
    foreign = {
        f"gpus[{i}].uuid": [
            f"GPU {g.uuid} is registered to another node; a GPU reports through one node only"
        ]
        for i, g in enumerate(report.gpus)
        if g.uuid in known and known[g.uuid].node_id != node.pk
    }
    if foreign:
        raise TelemetryError(
            f"batch refused: {next(iter(foreign.values()))[0]}", errors=foreign, status=403
        )
    try:
        with transaction.atomic():
            IngestBatch.objects.create(
                node=node,
                batch_id=report.batch_id,
                sent_at=report.sent_at,
                received_at=now,
                samples=len(report.samples),
                first_at=report.first_at,
                last_at=report.last_at,
            )
        duplicate = False
    except IntegrityError:
        owner = (
            IngestBatch.objects.filter(batch_id=report.batch_id)
            .values_list("node_id", flat=True)
            .first()
        )
        if owner != node.pk:
            message = "is already used by another node's batch; use a fresh UUID per batch"
            raise TelemetryError(
                f"batch_id {message}", errors={"batch_id": [message]}, status=409
            ) from None
        duplicate = True

    tiers_changed: set[int] = set()
    if not duplicate:
        gpus, tiers_changed = _gpus_update(node=node, report=report, known=known, now=now)
        _samples_store(report=report, gpus=gpus)
        _processes_store(node=node, report=report, gpus=gpus, now=now)

    was_healthy = node.healthy
    Node.objects.filter(pk=node.pk).update(
        healthy=True,
        last_seen_at=now,
        backend=report.backend,
        simulated=report.backend == Node.Backend.SIMULATED,
        hostname=report.hostname,
        agent_version=report.agent_version,
    )
    if not was_healthy:
        audit.record(
            actor=f"node:{node.name}",
            action="node.healthy",
            target=node,
            after={"backend": report.backend, "gpus": len(report.gpus)},
        )
        tiers_changed |= set(Gpu.objects.filter(node=node).values_list("tier_id", flat=True))
        tiers_changed.add(node.tier_id)
    if tiers_changed:
        tier_capacity_refresh(tiers=tiers_changed)
    _outcomes_record(node=node, report=report, now=now)
    return IngestResult(
        stored=0 if duplicate else len(report.samples),
        duplicate=duplicate,
        directives=_directives_deliver(node=node, now=now),
    )


def _gpus_update(
    *, node: Node, report: BatchReport, known: dict[str, Gpu], now: datetime
) -> tuple[dict[str, Gpu], set[int]]:
    """Discover new GPUs (in the node's tier), refresh changed ones, and mark the node's GPUs
    missing from the report unhealthy. Returns {uuid: Gpu} and the tiers whose capacity moved."""
    tiers_changed: set[int] = set()
    new = [
        Gpu(
            node=node,
            uuid=g.uuid,
            index=g.index,
            name=g.name,
            tier_id=node.tier_id,
            memory_total_mib=g.memory_total_mib,
            healthy=True,
            last_seen_at=now,
        )
        for g in report.gpus
        if g.uuid not in known
    ]
    if new:
        Gpu.objects.bulk_create(new)
        tiers_changed.add(node.tier_id)
        audit.record(
            actor=f"node:{node.name}",
            action="node.gpus_discovered",
            target=node,
            after={"gpus": [g.uuid for g in new], "tier": node.tier.slug},
        )
    for g in report.gpus:
        gpu = known.get(g.uuid)
        if gpu is None:
            continue
        changes = {
            name: value
            for name, value in (
                ("index", g.index),
                ("name", g.name),
                ("memory_total_mib", g.memory_total_mib),
                ("healthy", True),
            )
            if getattr(gpu, name) != value
        }
        if changes:
            if "healthy" in changes:
                tiers_changed.add(gpu.tier_id)
            for name, value in changes.items():
                setattr(gpu, name, value)
            gpu.save(update_fields=list(changes))
    gpus = {g.uuid: g for g in new} | known
    missing = Gpu.objects.filter(node=node).exclude(uuid__in=list(gpus))
    tiers_changed |= _gpus_unhealthy(missing)
    if known:
        Gpu.objects.filter(pk__in=[g.pk for g in known.values()]).update(last_seen_at=now)
    return gpus, tiers_changed


_SAMPLE_COLUMNS = (
    "gpu_id",
    "at",
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
    "energy_j",
)


def _samples_store(*, report: BatchReport, gpus: dict[str, Gpu]) -> None:
    if not report.samples:
        return
    ids = {uuid: gpu.pk for uuid, gpu in gpus.items()}
    if connection.vendor == "postgresql":
        # COPY is several times faster than a multi-row INSERT for the same rows (see
        # docs/telemetry.md for the figures).
        statement = f"COPY {Sample._meta.db_table} ({', '.join(_SAMPLE_COLUMNS)}) FROM STDIN"
        with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
            write = copy.write_row
            for row in report.samples:
                write((ids[row[0]], *row[1:]))
        return
    Sample.objects.bulk_create(
        [
            Sample(**dict(zip(_SAMPLE_COLUMNS, (ids[r[0]], *r[1:]), strict=True)))
            for r in report.samples
        ],
        batch_size=1000,
    )


def _processes_store(
    *, node: Node, report: BatchReport, gpus: dict[str, Gpu], now: datetime
) -> None:
    """Replace each GPU's observed processes with those of its newest sample, unless the
    server already holds a newer view (a batch delivered late from the agent's backlog)."""
    fresh = {
        gpus[uuid]: (at, processes)
        for uuid, (at, processes) in report.processes.items()
        if gpus[uuid].processes_at is None or at >= gpus[uuid].processes_at
    }
    if not fresh:
        return
    ProcessObservation.objects.filter(gpu__in=[g.pk for g in fresh]).delete()
    ProcessObservation.objects.bulk_create(
        [
            ProcessObservation(
                node=node,
                gpu=gpu,
                pid=p.pid,
                memory_mib=p.memory_mib,
                allocation_ref=p.allocation,
                slurm_job=p.slurm_job,
                pod=p.pod,
                state=p.state,
                at=at,
                seen_at=now,
            )
            for gpu, (at, processes) in fresh.items()
            # A process on one GPU is reported once; keep the first if an agent repeats it.
            for p in {p.pid: p for p in reversed(processes)}.values()
        ]
    )
    Gpu.objects.filter(pk__in=[g.pk for g in fresh]).update(
        processes_at=Case(*(When(pk=g.pk, then=Value(at)) for g, (at, _) in fresh.items()))
    )
    for gpu, (at, _) in fresh.items():
        gpu.processes_at = at


def _outcomes_record(*, node: Node, report: BatchReport, now: datetime) -> None:
    """Record what the agent did with directives. Outcomes arrive at least once: a repeat,
    or an id that is not this node's, changes nothing."""
    if not report.directive_results:
        return
    actions = {
        a.pk: a
        for a in EnforcementAction.objects.select_for_update(of=("self",))
        .select_related("tenant")
        .filter(node=node, pk__in=[r.id for r in report.directive_results])
        .order_by("pk")
    }
    for result in report.directive_results:
        action = actions.get(result.id)
        if action is None or not action.pending:
            continue
        before = action.state
        action.state = _OUTCOME_STATES[result.outcome]
        action.detail = result.detail
        action.acknowledged_at = now
        action.delivered_at = action.delivered_at or now
        action.save(update_fields=["state", "detail", "acknowledged_at", "delivered_at"])
        audit.record(
            actor=f"node:{node.name}",
            action=f"enforcement.{action.state}",
            target=action,
            tenant=action.tenant,
            before={"state": before},
            after={"state": action.state, "outcome": result.outcome, "detail": result.detail},
        )


def _directives_deliver(*, node: Node, now: datetime) -> list[EnforcementAction]:
    pending = list(
        EnforcementAction.objects.filter(node=node, state__in=EnforcementAction.PENDING_STATES)
        .select_related("gpu")
        .order_by("pk")[:MAX_DIRECTIVES_PER_RESPONSE]
    )
    issued = [a.pk for a in pending if a.state == EnforcementAction.State.ISSUED]
    if issued:
        EnforcementAction.objects.filter(pk__in=issued).update(
            state=EnforcementAction.State.DELIVERED, delivered_at=now
        )
        for action in pending:
            if action.state == EnforcementAction.State.ISSUED:
                action.state, action.delivered_at = EnforcementAction.State.DELIVERED, now
    return pending


# ---------------------------------------------------------------------------------------------
# Health, rollups, retention


@transaction.atomic
def nodes_health_check(*, now: datetime | None = None) -> list[Node]:
    """Mark nodes silent for GPUMARKET_NODE_STALE_SECONDS unhealthy; their GPUs leave the
    capacity of the next rounds. Returns the nodes marked."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS)
    stale = list(
        Node.objects.select_for_update()
        .filter(healthy=True, last_seen_at__lt=cutoff)
        .order_by("pk")
    )
    tiers: set[int] = set()
    for node in stale:
        node.healthy = False
        node.save(update_fields=["healthy"])
        tiers |= _gpus_unhealthy(Gpu.objects.filter(node=node))
        tiers.add(node.tier_id)
        audit.record(
            actor="telemetry",
            action="node.unhealthy",
            target=node,
            after={
                "last_seen_at": node.last_seen_at.isoformat() if node.last_seen_at else None,
                "stale_seconds": settings.GPUMARKET_NODE_STALE_SECONDS,
            },
        )
    if tiers:
        tier_capacity_refresh(tiers=tiers)
    return stale


@dataclass(frozen=True)
class RollupResult:
    batches: int
    minutes: int
    samples_purged: int
    batches_purged: int


ROLLUP_BATCHES = 5000


@transaction.atomic
def samples_rollup(*, now: datetime | None = None) -> RollupResult:
    """Fold new raw samples into per-minute rows, then drop raw samples (and batch records)
    older than GPUMARKET_SAMPLE_RETENTION_HOURS.

    A minute is recomputed from all its raw samples whenever a batch touches it, so late
    batches from an agent's backlog land in the right minute and a rerun changes nothing.
    """
    now = now or timezone.now()
    batches = list(
        IngestBatch.objects.select_for_update(skip_locked=True)
        .filter(rolled_up=False)
        .order_by("pk")
        .values("pk", "node_id", "first_at", "last_at")[:ROLLUP_BATCHES]
    )
    minutes = 0
    with_samples = [b for b in batches if b["first_at"] is not None]
    if with_samples:
        start = min(b["first_at"] for b in with_samples).replace(second=0, microsecond=0)
        end = max(b["last_at"] for b in with_samples).replace(second=0, microsecond=0)
        gpu_ids = list(
            Gpu.objects.filter(node_id__in={b["node_id"] for b in with_samples}).values_list(
                "pk", flat=True
            )
        )
        rows = (
            Sample.objects.filter(
                gpu_id__in=gpu_ids, at__gte=start, at__lt=end + timedelta(minutes=1)
            )
            .annotate(minute=TruncMinute("at"))
            .values("gpu_id", "minute")
            .annotate(
                n=Count("id"),
                util_avg=Avg("utilization_pct"),
                util_max=Max("utilization_pct"),
                mem_avg=Avg("memory_used_mib"),
                mem_max=Max("memory_used_mib"),
                power_avg=Avg("power_w"),
                power_max=Max("power_w"),
                temp_max=Max("temperature_c"),
                energy_last=Max("energy_j"),
            )
            .order_by()
        )
        aggregates = [
            SampleMinute(
                gpu_id=r["gpu_id"],
                minute=r["minute"],
                samples=r["n"],
                utilization_avg=r["util_avg"],
                utilization_max=r["util_max"],
                memory_used_avg=r["mem_avg"],
                memory_used_max=r["mem_max"],
                power_avg=r["power_avg"],
                power_max=r["power_max"],
                temperature_max=r["temp_max"],
                energy_j_last=r["energy_last"],
            )
            for r in rows
        ]
        SampleMinute.objects.bulk_create(
            aggregates,
            batch_size=1000,
            update_conflicts=True,
            unique_fields=["gpu", "minute"],
            update_fields=[
                "samples",
                "utilization_avg",
                "utilization_max",
                "memory_used_avg",
                "memory_used_max",
                "power_avg",
                "power_max",
                "temperature_max",
                "energy_j_last",
            ],
        )
        minutes = len(aggregates)
    if batches:
        IngestBatch.objects.filter(pk__in=[b["pk"] for b in batches]).update(rolled_up=True)
    cutoff = now - timedelta(hours=settings.GPUMARKET_SAMPLE_RETENTION_HOURS)
    samples_purged, _ = Sample.objects.filter(at__lt=cutoff).delete()
    batches_purged, _ = IngestBatch.objects.filter(received_at__lt=cutoff, rolled_up=True).delete()
    return RollupResult(
        batches=len(batches),
        minutes=minutes,
        samples_purged=samples_purged,
        batches_purged=batches_purged,
    )
