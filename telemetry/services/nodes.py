"""Nodes and their tokens, and the capacity their GPUs give their tiers."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

import audit.services as audit
from core.tokens import token_matches, token_mint, token_prefix
from market.models import Tier
from market.services import tier_capacity_set
from telemetry.errors import TelemetryError
from telemetry.models import Gpu, Node

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
