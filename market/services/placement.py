"""Placement of a round's awards on concrete GPUs (the rules are in market/placement).

Clearing asks ``placement_misfits`` which gang awards cannot be placed whole, and clears again
without them; settlement calls ``round_placement`` in its own transaction and stores each
allocation's GPUs. A tier whose GPUs no node reports (capacity typed in by hand) is not
placed: its allocations keep an empty placement, as before placement existed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from market.models import Allocation, Bid, Round
from market.placement import FreeGpu, Placement, Request, largest_gang, place
from market.placement.inventory import tier_gpus

LIVE = (Allocation.Status.ACTIVE, Allocation.Status.PAUSED)


def gpus_taken(
    *, tier_slug: str, starts_at: datetime, ends_at: datetime, round_id: int
) -> set[str]:
    """GPU uuids held by other rounds' live allocations whose windows overlap this one."""
    rows = (
        Allocation.objects.filter(
            tier__slug=tier_slug, status__in=LIVE, starts_at__lt=ends_at, ends_at__gt=starts_at
        )
        .exclude(round_id=round_id)
        .values_list("placement", flat=True)
    )
    return {gpu["uuid"] for placement in rows for gpu in placement}


def gpus_free(
    *, tier_slug: str, starts_at: datetime, ends_at: datetime, round_id: int = 0
) -> list[FreeGpu]:
    taken = gpus_taken(tier_slug=tier_slug, starts_at=starts_at, ends_at=ends_at, round_id=round_id)
    return [g for g in tier_gpus(tier_slug) if g.uuid not in taken]


def _previous(rnd: Round, slug: str) -> dict[int, list[tuple[int, tuple[str, ...]]]]:
    """Per tenant, the (GPUs, uuids) of its allocations on ``slug`` ending as this round starts."""
    rows = Allocation.objects.filter(
        tier__slug=slug, ends_at=rnd.starts_at, status__in=(*LIVE, Allocation.Status.FINISHED)
    ).values_list("tenant_id", "gpus", "placement")
    out: dict[int, list[tuple[int, tuple[str, ...]]]] = defaultdict(list)
    for tenant_id, gpus, placement in rows:
        if placement:
            out[tenant_id].append((gpus, tuple(g["uuid"] for g in placement)))
    return out


def _orders_last(
    rnd: Round, slug: str, bid_ids: list[int]
) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Per bid of a standing order, the (GPUs, uuids) of its order's latest allocation on
    ``slug`` before this round: its work (running on, or suspended there) resumes on those
    GPUs when they are free."""
    order_of = dict(
        Bid.objects.filter(pk__in=bid_ids, order__isnull=False).values_list("pk", "order_id")
    )
    if not order_of:
        return {}
    latest: dict[int, tuple[int, tuple[str, ...]]] = {}
    rows = (
        Allocation.objects.filter(
            bid__order_id__in=set(order_of.values()),
            tier__slug=slug,
            ends_at__lte=rnd.starts_at,
        )
        .exclude(placement=[])
        .order_by("bid__order_id", "-ends_at", "-pk")
        .values_list("bid__order_id", "gpus", "placement")
    )
    for order_id, gpus, placement in rows:
        latest.setdefault(order_id, (gpus, tuple(g["uuid"] for g in placement)))
    return {bid: latest[order] for bid, order in order_of.items() if order in latest}


def round_placement(
    *,
    rnd: Round,
    awards: Iterable[tuple[int, str, int]],
    gang: Mapping[int, bool],
    tenant: Mapping[int, int],
) -> dict[str, Placement | None]:
    """Per tier slug, the placement of the awards (bid id, slug, GPUs); None for a tier no
    node reports GPUs for. ``gang``: bid id -> must run in one piece. A team's allocation of
    the same size on the same tier in the window just before keeps its GPUs."""
    by_tier: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for bid_id, slug, gpus in awards:
        by_tier[slug].append((int(bid_id), int(gpus)))
    result: dict[str, Placement | None] = {}
    for slug, rows in sorted(by_tier.items()):
        inventory = tier_gpus(slug)
        if not inventory:
            result[slug] = None
            continue
        taken = gpus_taken(
            tier_slug=slug, starts_at=rnd.starts_at, ends_at=rnd.ends_at, round_id=rnd.pk
        )
        previous = _previous(rnd, slug)
        ordered = _orders_last(rnd, slug, [bid_id for bid_id, _ in rows])
        requests = []
        for bid_id, gpus in sorted(rows):
            keep: tuple[str, ...] = ()
            if bid_id in ordered and ordered[bid_id][0] == gpus:
                requests.append(
                    Request(bid_id, gpus, gang=gang.get(bid_id, False), keep=ordered[bid_id][1])
                )
                continue
            held = previous.get(tenant.get(bid_id, 0), [])
            for i, (count, uuids) in enumerate(held):
                if count == gpus:
                    keep = uuids
                    del held[i]
                    break
            requests.append(Request(bid_id, gpus, gang=gang.get(bid_id, False), keep=keep))
        result[slug] = place(requests, [g for g in inventory if g.uuid not in taken])
    return result


def placement_misfits(
    *,
    rnd: Round,
    awards: Iterable[tuple[int, str, int]],
    gang: Mapping[int, bool],
    tenant: Mapping[int, int],
) -> dict[int, str]:
    """Gang awards that cannot be placed in one piece: {bid id: why}, for the bid's reason."""
    misfits: dict[int, str] = {}
    awards = list(awards)
    for slug, placement in round_placement(
        rnd=rnd, awards=awards, gang=gang, tenant=tenant
    ).items():
        if placement is None:
            continue
        sizes = {int(b): int(g) for b, s, g in awards if s == slug}
        node_room, _ = largest_gang(
            placement.free + [g for p in placement.placed.values() for g in p]
        )
        for bid_id in placement.unplaced:
            misfits[int(bid_id)] = (
                f"its {sizes[int(bid_id)]} GPUs on {slug} must run together and no node had "
                f"that many free (at most {node_room})"
            )
    return misfits


def as_json(gpus: Iterable[FreeGpu]) -> list[dict]:
    return [{"node": g.node, "index": g.index, "uuid": g.uuid} for g in sorted(gpus)]


def tier_fragmentation(tier_slug: str, *, at: datetime) -> tuple[int, int, int]:
    """(GPUs free, largest gang one node could still take, largest inside one NVLink domain)
    on the tier at ``at``: what the fleet page shows per tier."""
    free = gpus_free(tier_slug=tier_slug, starts_at=at, ends_at=at + timedelta(seconds=1))
    node_room, domain_room = largest_gang(free)
    return len(free), node_room, domain_room
