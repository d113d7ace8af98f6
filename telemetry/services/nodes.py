"""Nodes and their tokens, and the capacity their GPUs give their tiers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

import audit.services as audit
from core.tokens import token_matches, token_mint, token_prefix
from market.models import Allocation, Round, Tier
from market.services.failures import allocations_gpus_failed
from market.services.tiers import tier_capacity_set
from telemetry.errors import TelemetryError
from telemetry.models import Gpu, Node
from telemetry.payload.reports import GpuHealth

TOKEN_SCHEME = "gmn_"


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
    minted = token_mint(scheme=TOKEN_SCHEME)
    node = Node.objects.create(
        name=name, tier=tier, token_prefix=minted.prefix, token_hash=minted.hash
    )
    audit.record(
        actor=actor,
        action="node.register",
        target=node,
        after={"name": name, "tier": tier.slug, "token_prefix": minted.prefix},
    )
    return node, minted.secret


@transaction.atomic
def node_token_revoke(*, node: Node, actor: AbstractBaseUser | str | None) -> Node:
    """Refuse the node's token from now on; its GPUs leave their tier's capacity."""
    locked = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
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
    prefix = token_prefix(token, scheme=TOKEN_SCHEME)
    node = Node.objects.filter(token_prefix=prefix).first() if prefix is not None else None
    if not token_matches(token, node.token_hash if node is not None else None):
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


def _next_window_start() -> datetime | None:
    """When the earliest round not yet cleared starts (None: no such round)."""
    return (
        Round.objects.filter(status__in=(Round.Status.OPEN, Round.Status.CLOSED))
        .order_by("starts_at")
        .values_list("starts_at", flat=True)
        .first()
    )


def _held(tier_ids: set[int], healthy: dict[int, set[str]]) -> dict[int, int]:
    """Per tier, the healthy GPUs held into the next round's window by running work of a
    longer window (one that started before that window and runs past its start). Work of
    the window just before ends as the next one starts, so it holds nothing."""
    start = _next_window_start()
    if start is None:
        return {}
    held: dict[int, int] = {}
    rows = Allocation.objects.filter(
        tier_id__in=tier_ids,
        status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
        starts_at__lt=start,
        ends_at__gt=start,
    ).values_list("tier_id", "gpus", "placement")
    for tier_id, gpus, placement in rows:
        on = (
            len({g["uuid"] for g in placement} & healthy.get(tier_id, set())) if placement else gpus
        )
        held[tier_id] = held.get(tier_id, 0) + on
    return held


def tier_capacity_refresh(
    *, tiers: Iterable[int | Tier] | None = None, actor: AbstractBaseUser | str | None = "telemetry"
) -> dict[str, int]:
    """Set each tier's capacity to what it can sell: its healthy GPUs not in maintenance, on
    healthy nodes that are not revoked, less the GPUs running work of longer windows holds.

    ``tiers`` None measures every tier: one that no node reports GPUs for has none to sell
    (a capacity typed in by hand is not supply). An admin lowers a tier's offer with its
    maintenance GPUs. Unchanged capacities are not written (nor audited). Returns
    {slug: capacity}.
    """
    tier_qs = Tier.objects.all()
    if tiers is not None:
        tier_qs = tier_qs.filter(pk__in={t.pk if isinstance(t, Tier) else t for t in tiers})
    tier_list = list(tier_qs.order_by("pk"))
    tier_ids = {t.pk for t in tier_list}
    healthy: dict[int, set[str]] = {}
    for tier_id, uuid in Gpu.objects.filter(
        tier_id__in=tier_ids,
        healthy=True,
        maintenance=False,
        node__healthy=True,
        node__revoked_at__isnull=True,
    ).values_list("tier_id", "uuid"):
        healthy.setdefault(tier_id, set()).add(uuid)
    held = _held(tier_ids, healthy)
    result = {}
    for tier in tier_list:
        count = len(healthy.get(tier.pk, ()))
        capacity = max(count - held.get(tier.pk, 0), 0)
        if tier.capacity != capacity:
            tier_capacity_set(tier=tier, capacity=capacity, actor=actor)
        result[tier.slug] = capacity
    return result


@transaction.atomic
def gpu_maintenance_set(
    *, gpu: Gpu, maintenance: bool, actor: AbstractBaseUser | str | None
) -> Gpu:
    """Take a GPU out of (or back into) its tier's capacity for the next rounds; back into
    service also clears the failure that took it out."""
    if not isinstance(maintenance, bool):
        raise TelemetryError(f"maintenance must be true or false, got {maintenance!r}")
    locked = Gpu.objects.select_for_update(no_key=True).get(pk=gpu.pk)
    if locked.maintenance == maintenance:
        return locked
    before = {"maintenance": not maintenance, "failure": locked.failure}
    locked.maintenance = maintenance
    fields = ["maintenance"]
    if not maintenance and locked.failure:
        # Back in service: someone looked at the failure (a new one sets it again).
        locked.failure, locked.failed_at = "", None
        fields += ["failure", "failed_at"]
    locked.save(update_fields=fields)
    audit.record(
        actor=actor,
        action="gpu.maintenance",
        target=locked,
        before=before,
        after={"maintenance": maintenance},
    )
    tier_capacity_refresh(tiers=[locked.tier_id])
    gpu.maintenance, gpu.failure, gpu.failed_at = maintenance, locked.failure, locked.failed_at
    return locked


# ---------------------------------------------------------------------------------------------
# Health: what NVML reports about a GPU, and GPUs that failed

# XID codes that mean the GPU cannot be trusted with work until someone looks at it (NVIDIA's
# XID catalogue: double-bit ECC, row-remap failure, NVLink error, fallen off the bus, GSP and
# uncontained-memory errors). Application faults (13, 31, 43, 45) are the job's, not the
# GPU's, and are only recorded.
FATAL_XIDS = frozenset({48, 61, 62, 64, 69, 74, 79, 92, 94, 95, 119, 120, 140})


def health_failure(health: GpuHealth) -> str:
    """Why a health reading takes its GPU out of service ("" = it does not)."""
    if health.lost:
        return "GPU lost: NVML can no longer reach it"
    fatal = [code for code in health.xid if code in FATAL_XIDS]
    if fatal:
        return f"XID {fatal[0]} error" + (
            f" (and {', '.join(map(str, fatal[1:]))})" if fatal[1:] else ""
        )
    if health.ecc_volatile_uncorrected:
        return (
            f"{health.ecc_volatile_uncorrected} uncorrectable ECC error(s) since the driver loaded"
        )
    return ""


@transaction.atomic
def gpus_health_apply(
    *, node: Node, health: Mapping[str, tuple[datetime, GpuHealth]], now: datetime | None = None
) -> list[Gpu]:
    """Record each GPU's latest health reading ({uuid: (sample time, reading)}) and take a
    GPU whose reading is fatal out of service: into maintenance, with the reason, out of its
    tier's capacity, and its allocations refunded and moved. Returns the GPUs that failed now.
    """
    now = now or timezone.now()
    gpus = list(
        Gpu.objects.select_for_update(no_key=True)
        .filter(node=node, uuid__in=sorted(health))
        .order_by("pk")
    )
    failed: list[Gpu] = []
    for gpu in gpus:
        at, reading = health[gpu.uuid]
        fields = {
            "throttle_reasons": sorted(reading.throttle),
            "xid_last": reading.xid[-1] if reading.xid else gpu.xid_last,
            "ecc_volatile_uncorrected": reading.ecc_volatile_uncorrected,
            "ecc_aggregate_uncorrected": reading.ecc_aggregate_uncorrected,
        }
        reason = health_failure(reading)
        if reason and not gpu.failure:
            fields |= {"failure": reason[:300], "failed_at": at, "maintenance": True}
            failed.append(gpu)
        changed = [name for name, value in fields.items() if getattr(gpu, name) != value]
        for name in changed:
            setattr(gpu, name, fields[name])
        if changed:
            gpu.save(update_fields=changed)
    for gpu in failed:
        audit.record(
            actor=f"node:{node.name}",
            action="gpu.failure",
            target=gpu,
            after={"failure": gpu.failure, "failed_at": gpu.failed_at.isoformat()},
        )
    if failed:
        tier_capacity_refresh(tiers={g.tier_id for g in failed})
        for gpu in failed:
            allocations_gpus_failed(
                uuids={gpu.uuid},
                failed_at=gpu.failed_at,
                reason=f"GPU {node.name}/{gpu.index}: {gpu.failure}",
                actor="telemetry",
                now=now,
            )
    return failed


def failed_gpus_sweep(*, now: datetime | None = None) -> int:
    """Refund and move allocations still placed on a failed GPU or a GPU of an unhealthy
    node (one settled onto it while it was failing). Returns the allocations handled."""
    now = now or timezone.now()
    placed = {
        gpu["uuid"]
        for placement in Allocation.objects.filter(
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED), ends_at__gt=now
        ).values_list("placement", flat=True)
        for gpu in placement
    }
    failures: dict[tuple[datetime, str], set[str]] = {}
    for gpu in (
        Gpu.objects.filter(uuid__in=placed)
        .filter(Q(node__healthy=False) | ~Q(failure=""))
        .select_related("node")
        .order_by("pk")
    ):
        if gpu.failure:
            key = (gpu.failed_at or now, f"GPU {gpu.node.name}/{gpu.index}: {gpu.failure}")
        else:
            key = (gpu.node.last_seen_at or now, f"node {gpu.node.name} went silent")
        failures.setdefault(key, set()).add(gpu.uuid)
    return sum(
        len(
            allocations_gpus_failed(
                uuids=uuids, failed_at=failed_at, reason=reason, actor="telemetry", now=now
            )
        )
        for (failed_at, reason), uuids in sorted(failures.items())
    )
