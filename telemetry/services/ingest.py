"""Ingest: one batch from a node's agent stored, its directive outcomes recorded, and its
pending directives handed back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

import audit.services as audit
from telemetry.errors import TelemetryError
from telemetry.models import EnforcementAction, Gpu, IngestBatch, Node, ProcessObservation, Sample
from telemetry.payload import BatchReport, Limits, payload_parse
from telemetry.services.nodes import (
    _gpus_unhealthy,
    _unauthorised,
    gpus_health_apply,
    tier_capacity_refresh,
)


@dataclass(frozen=True)
class IngestResult:
    stored: int
    duplicate: bool
    # Directives for the node's agent, oldest first: pending ones are sent again until the
    # agent reports their outcome (the agent applies each id once).
    directives: list[EnforcementAction]
    # Untrusted process claims dropped from this batch, by field (the batch itself was kept).
    refused: dict[str, list[str]]
    # GPU uuid -> the power limit its tier wants, in watts (None: no cap), for every GPU of
    # the node: the agent sets the GPUs' limits from it (docs/capacity.md "Energy").
    power_caps: dict[str, int | None]


_OUTCOME_STATES = {
    "done": EnforcementAction.State.ACKNOWLEDGED,
    "gone": EnforcementAction.State.GONE,
    "failed": EnforcementAction.State.FAILED,
}
MAX_DIRECTIVES_PER_RESPONSE = 500


def samples_ingest(*, node: Node, payload: dict, now: datetime | None = None) -> IngestResult:
    """Validate and store one batch from ``node``'s agent; record directive outcomes; return
    the node's pending directives.

    A batch with any bad field the agent measured is refused whole (TelemetryError with field
    errors) and nothing of it is stored. A bad claim a process made about itself (allocation,
    Slurm job, pod) is dropped and named in ``refused``; the rest of the batch is stored. A batch id seen before is stored once: the retry gets
    ``duplicate=True`` and the directives, so an agent whose response was lost loses nothing.
    """
    now = now or timezone.now()
    report = payload_parse(payload, now=now, limits=Limits.from_settings())
    with transaction.atomic():
        return _ingest(node=node, report=report, now=now)


def _ingest(*, node: Node, report: BatchReport, now: datetime) -> IngestResult:
    # One node's batches are applied one at a time (an agent posts in order; this also
    # serialises a retry racing its original).
    node = (
        Node.objects.select_for_update(no_key=True, of=("self",))
        .select_related("tier")
        .get(pk=node.pk)
    )
    if node.revoked_at is not None:
        raise _unauthorised(f"the token of node {node.name!r} was revoked")
    reported = {g.uuid for g in report.gpus}
    rows, known = _gpus_read(node=node, report=report, reported=reported)
    duplicate = _batch_claim(node=node, report=report, now=now)
    tiers_changed: set[int] = set()
    if not duplicate:
        missing = [g for g in rows if g.node_id == node.pk and g.uuid not in reported]
        gpus, tiers_changed = _gpus_update(
            node=node, report=report, known=known, missing=missing, now=now
        )
        _samples_store(report=report, gpus=gpus)
        fresh = _processes_store(node=node, report=report, gpus=gpus, now=now)
        _gpus_seen(known=known, fresh=fresh, now=now)

    tiers_changed |= _node_seen(node=node, report=report, duplicate=duplicate, now=now)
    if tiers_changed:
        tier_capacity_refresh(tiers=tiers_changed)
    if report.health and not duplicate:
        gpus_health_apply(node=node, health=report.health, now=now)
    _outcomes_record(node=node, report=report, now=now)
    return IngestResult(
        stored=0 if duplicate else len(report.samples),
        duplicate=duplicate,
        directives=_directives_deliver(node=node, now=now),
        refused=report.refused,
        power_caps={g.uuid: g.power_cap_w for g in rows if g.node_id == node.pk}
        | {g.uuid: node.tier.power_cap_w for g in report.gpus if g.uuid not in known},
    )


def _gpus_read(
    *, node: Node, report: BatchReport, reported: set[str]
) -> tuple[list[Gpu], dict[str, Gpu]]:
    """In one query: the GPUs the batch names (wherever registered) and the node's own, with
    their tiers' power caps for the answer; and the named ones by uuid. A GPU registered to
    another node is refused (403)."""
    rows = list(
        Gpu.objects.filter(Q(uuid__in=reported) | Q(node=node)).annotate(
            power_cap_w=F("tier__power_cap_w")
        )
    )
    known = {g.uuid: g for g in rows if g.uuid in reported}
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
    return rows, known


def _batch_claim(*, node: Node, report: BatchReport, now: datetime) -> bool:
    """Record the batch; True when this node sent it before (a retry: nothing is stored
    again). A batch id another node used is refused (409)."""
    duplicate = not _batch_record(node=node, report=report, now=now)
    if duplicate:
        owner = (
            IngestBatch.objects.filter(batch_id=report.batch_id)
            .values_list("node_id", flat=True)
            .first()
        )
        if owner != node.pk:
            message = "is already used by another node's batch; use a fresh UUID per batch"
            raise TelemetryError(f"batch_id {message}", errors={"batch_id": [message]}, status=409)
    return duplicate


def _node_seen(*, node: Node, report: BatchReport, duplicate: bool, now: datetime) -> set[int]:
    """Mark the node seen and healthy with what the agent says of itself and the fields it
    refused; a node that comes back is audited and returns the tiers whose supply changed."""
    refusal: dict[str, object] = {}
    if report.refused and not duplicate:
        name, messages = next(iter(report.refused.items()))
        refusal = {
            "refused_fields": F("refused_fields") + sum(map(len, report.refused.values())),
            "last_refusal": f"{name}: {messages[0]}"[:300],
            "last_refusal_at": now,
        }
    Node.objects.filter(pk=node.pk).update(
        healthy=True,
        last_seen_at=now,
        backend=report.backend,
        simulated=report.backend == Node.Backend.SIMULATED,
        hostname=report.hostname,
        agent_version=report.agent_version,
        **refusal,
    )
    if node.healthy:
        return set()
    audit.record(
        actor=f"node:{node.name}",
        action="node.healthy",
        target=node,
        after={"backend": report.backend, "gpus": len(report.gpus)},
    )
    tiers = set(Gpu.objects.filter(node=node).values_list("tier_id", flat=True))
    tiers.add(node.tier_id)
    return tiers


def _batch_record(*, node: Node, report: BatchReport, now: datetime) -> bool:
    """Record the batch; False when its batch id is already recorded. One statement
    (INSERT ... ON CONFLICT DO NOTHING), without the savepoint a caught IntegrityError
    needs."""
    table = IngestBatch._meta.db_table
    field = IngestBatch._meta.get_field
    values = [
        field(name).get_db_prep_value(value, connection)
        for name, value in (
            ("node", node.pk),
            ("batch_id", report.batch_id),
            ("sent_at", report.sent_at),
            ("received_at", now),
            ("samples", len(report.samples)),
            ("first_at", report.first_at),
            ("last_at", report.last_at),
            ("rolled_up", False),
        )
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (node_id, batch_id, sent_at, received_at, samples, first_at, "
            "last_at, rolled_up) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (batch_id) DO NOTHING RETURNING id",
            values,
        )
        return cursor.fetchone() is not None


def batch_refusal_record(*, node: Node, reason: str, now: datetime | None = None) -> None:
    """Count a batch of ``node`` refused whole (a 4xx after the node authenticated), so that
    a node whose reports stop getting through shows on the fleet page and in /metrics."""
    Node.objects.filter(pk=node.pk).update(
        refused_batches=F("refused_batches") + 1,
        last_refusal=reason[:300],
        last_refusal_at=now or timezone.now(),
    )


def _gpus_update(
    *,
    node: Node,
    report: BatchReport,
    known: dict[str, Gpu],
    missing: list[Gpu],
    now: datetime,
) -> tuple[dict[str, Gpu], set[int]]:
    """Discover new GPUs (in the node's tier), refresh changed ones, and mark the node's GPUs
    missing from the report (``missing``) unhealthy. Returns {uuid: Gpu} and the tiers whose
    capacity moved."""
    tiers_changed: set[int] = set()
    new = [
        Gpu(
            node=node,
            uuid=g.uuid,
            index=g.index,
            name=g.name,
            tier_id=node.tier_id,
            memory_total_mib=g.memory_total_mib,
            nvlink_domain=g.nvlink_domain,
            pcie_switch=g.pcie_switch,
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
                ("nvlink_domain", g.nvlink_domain),
                ("pcie_switch", g.pcie_switch),
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
    gone = [g.pk for g in missing if g.healthy]
    if gone:
        tiers_changed |= _gpus_unhealthy(Gpu.objects.filter(pk__in=gone))
    return gpus, tiers_changed


def _gpus_seen(*, known: dict[str, Gpu], fresh: dict[Gpu, datetime], now: datetime) -> None:
    """One UPDATE: the known GPUs seen now, and the sample time of each process list kept."""
    ids = {g.pk for g in known.values()} | {g.pk for g in fresh}
    if not ids:
        return
    changes: dict[str, object] = {}
    if known:
        changes["last_seen_at"] = Case(
            When(pk__in=[g.pk for g in known.values()], then=Value(now)),
            default=F("last_seen_at"),
        )
    if fresh:
        changes["processes_at"] = Case(
            *(When(pk=g.pk, then=Value(at)) for g, at in fresh.items()),
            default=F("processes_at"),
        )
    Gpu.objects.filter(pk__in=ids).update(**changes)


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


def _sample_types() -> list[str]:
    """The PostgreSQL types of the COPY columns, as binary COPY needs them exactly."""
    return [Sample._meta.get_field(name).db_type(connection) for name in _SAMPLE_COLUMNS]


def _samples_store(*, report: BatchReport, gpus: dict[str, Gpu]) -> None:
    if not report.samples:
        return
    ids = {uuid: gpu.pk for uuid, gpu in gpus.items()}
    if connection.vendor == "postgresql":
        # COPY is several times faster than a multi-row INSERT for the same rows, and its
        # binary format spares the server parsing every number and time from text (see
        # docs/telemetry.md for the figures).
        statement = (
            f"COPY {Sample._meta.db_table} ({', '.join(_SAMPLE_COLUMNS)}) FROM STDIN "
            "(FORMAT BINARY)"
        )
        with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
            copy.set_types(_sample_types())
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
) -> dict[Gpu, datetime]:
    """Replace each GPU's observed processes with those of its newest sample, unless the
    server already holds a newer view (a batch delivered late from the agent's backlog).
    Returns the GPUs whose view was replaced and its sample time (for ``_gpus_seen``)."""
    fresh = {
        gpus[uuid]: (at, processes)
        for uuid, (at, processes) in report.processes.items()
        if gpus[uuid].processes_at is None or at >= gpus[uuid].processes_at
    }
    if not fresh:
        return {}
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
                launch_token=p.launch_token,
                state=p.state,
                at=at,
                seen_at=now,
            )
            for gpu, (at, processes) in fresh.items()
            # A process on one GPU is reported once; keep the first if an agent repeats it.
            for p in {p.pid: p for p in reversed(processes)}.values()
        ]
    )
    for gpu, (at, _) in fresh.items():
        gpu.processes_at = at
    return {gpu: at for gpu, (at, _) in fresh.items()}


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
