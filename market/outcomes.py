"""Why a bid won less than it asked, like a batch scheduler's pending reasons: worked out once,
at settlement, from the round's own outcome (prices, awards, capacities, the policy's reserve
prices and share caps, and the bids the clearing left out over a hard cap). Pure: no database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from django.db import models

from tenants.ledger import credits


class Reason(models.TextChoices):
    WON = "won", "Won all it asked"
    HARD_CAP = "hard_cap", "Budget or cap"
    BELOW_RESERVE = "below_reserve", "Below reserve"
    OUTBID = "outbid", "Outbid"
    GANG = "gang", "Gang did not fit"
    SHARE_CAP = "share_cap", "Team share cap"
    FAIR_SHARE = "fair_share", "Fair share"
    CAPACITY = "capacity", "Capacity"


@dataclass(frozen=True)
class RoundFacts:
    """What the round decided, in milli-credits per GPU-hour and GPUs, keyed by tier slug."""

    mechanism: str
    prices: Mapping[str, int]
    reserves: Mapping[str, int]
    capacities: Mapping[str, int]
    share_cap_pct: Mapping[str, int]
    # GPUs each tenant got per tier: {(tenant id, tier slug): GPUs}
    tenant_gpus: Mapping[tuple[int, str], int]
    # Bids left out of the clearing over a hard cap: {bid id: why}
    left_out: Mapping[int, str]
    # Gangs left out because no node could hold all their GPUs: {bid id: why}
    misplaced: Mapping[int, str] = field(default_factory=dict)


def bid_reason(
    *,
    bid_id: int,
    tenant_id: int,
    quantity: int,
    min_quantity: int,
    limits: Mapping[str, int],
    awarded: Mapping[str, int],
    facts: RoundFacts,
) -> tuple[str, str]:
    """(reason code, a sentence a researcher reads) for one bid of a settled round.

    The first cause that holds, in order: the bid won all; it was left out before the
    clearing; its prices (reserve, outbid); its gang; its team's share cap; the tier's
    capacity or the policy's fair shares."""
    got = sum(awarded.values())
    if got >= quantity:
        where = ", ".join(f"{g} x {slug}" for slug, g in sorted(awarded.items()))
        whole = "the 1 GPU" if quantity == 1 else f"all {quantity} GPUs"
        return Reason.WON, f"Won {whole} asked ({where})."
    head = f"Won {got} of {quantity} GPUs: " if got else "Won nothing: "
    found = _left_out(bid_id, facts) or _priced_out(limits, facts)
    if found:
        return found[0], head + found[1]
    reserved = {s: p for s, p in limits.items() if p >= facts.reserves.get(s, 0)}
    affordable = {s: p for s, p in reserved.items() if facts.prices.get(s, 0) <= p}
    if min_quantity and not got:
        return Reason.GANG, head + (
            f"all or nothing for {max(min_quantity, 1)} GPUs on one tier, and no tier you "
            "accept had that many left for it at your limits."
        )
    code, text = _short_of_room(tenant_id, affordable, facts)
    return code, head + text


def _left_out(bid_id: int, facts: RoundFacts) -> tuple[str, str] | None:
    """Left out before the clearing: over a hard cap, or a gang no node could hold."""
    if bid_id in facts.left_out:
        return Reason.HARD_CAP, f"left out of the round because {facts.left_out[bid_id]}."
    if bid_id in facts.misplaced:
        return Reason.GANG, (
            f"left out of the round because {facts.misplaced[bid_id]}; the round was cleared "
            "again without it, so nothing was charged."
        )
    return None


def _priced_out(limits: Mapping[str, int], facts: RoundFacts) -> tuple[str, str] | None:
    """Every limit below its tier's reserve, or below the price its tier cleared at."""
    reserved = {s: p for s, p in limits.items() if p >= facts.reserves.get(s, 0)}
    if not reserved:
        shown = "; ".join(
            f"{s} reserve {credits(facts.reserves.get(s, 0))} > your {credits(p)}"
            for s, p in sorted(limits.items())
        )
        return Reason.BELOW_RESERVE, f"every limit is below its tier's reserve ({shown})."
    if not any(facts.prices.get(s, 0) <= p for s, p in reserved.items()):
        slug = min(reserved, key=lambda s: facts.prices.get(s, 0) - reserved[s])
        return Reason.OUTBID, (
            f"outbid: {slug} cleared at {credits(facts.prices.get(slug, 0))} credits/GPU-h, "
            f"above your limit of {credits(reserved[slug])}."
        )
    return None


def _short_of_room(
    tenant_id: int, affordable: Mapping[str, int], facts: RoundFacts
) -> tuple[str, str]:
    """The bid could pay for ``affordable``'s tiers and still won less: its team's share cap,
    the tier's capacity, or the fair shares of the policy."""
    capped = []
    for slug in sorted(affordable):
        pct = facts.share_cap_pct.get(slug, 100)
        most = pct * facts.capacities.get(slug, 0) // 100
        if pct < 100 and facts.tenant_gpus.get((tenant_id, slug), 0) >= most:
            capped.append(f"{slug} ({pct} % = {most} GPUs)")
    if len(capped) == len(affordable):
        return Reason.SHARE_CAP, (
            "your team holds the most a team may have of " + ", ".join(capped) + "."
        )
    # Where no other team won any GPU of a tier the bid could pay for, other teams' claims
    # were not the cause: a share cap was (whole GPUs can leave a team a GPU below it), or
    # else the tier simply had no more.
    others = {
        slug
        for (tenant, slug), gpus in facts.tenant_gpus.items()
        if tenant != tenant_id and gpus > 0 and slug in affordable
    }
    if not others:
        held = [s for s in sorted(affordable) if facts.share_cap_pct.get(s, 100) < 100]
        if held:
            slug = held[0]
            pct, capacity = facts.share_cap_pct[slug], facts.capacities.get(slug, 0)
            return Reason.SHARE_CAP, (
                f"no other team won {slug} GPUs at your price; a team may hold at most "
                f"{pct} % of {slug} ({pct * capacity // 100} of its {capacity} GPUs), and the "
                f"clearing's whole GPUs left your team {facts.tenant_gpus.get((tenant_id, slug), 0)}."
            )
        slug = max(affordable, key=lambda s: affordable[s])
        return Reason.CAPACITY, (
            f"{slug} had no more GPUs: your team won all {facts.capacities.get(slug, 0)} it "
            "offered, and no other team won any."
            if facts.tenant_gpus.get((tenant_id, slug), 0) >= facts.capacities.get(slug, 0)
            else f"{slug} had no more GPUs for you at your limit, and no other team won any."
        )
    if facts.mechanism != "welfare":
        return Reason.FAIR_SHARE, (
            f"the {facts.mechanism} policy gave the GPUs at your price to teams further below "
            "their fair share."
        )
    slug = max(affordable, key=lambda s: affordable[s])
    return Reason.CAPACITY, (
        f"{slug} had no more GPUs for you at {credits(facts.prices.get(slug, 0))} credits/GPU-h "
        "(within your limit): they went to higher bids, to earlier bids at the same price, or "
        "to other teams' guaranteed shares."
    )
