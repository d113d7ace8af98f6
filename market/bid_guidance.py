"""What the bid form shows beside each tier (GPUs offered, reserve, last price, share cap) and
the warnings it gives before a bid is placed. Pure: the facts come in, sentences go out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tenants.ledger import credits


@dataclass(frozen=True)
class TierGuide:
    slug: str
    name: str
    offered: int  # GPUs offered to this round
    reserve: int  # milli-credits per GPU-hour
    last_price: int | None  # the last settled round's price, milli-credits per GPU-hour
    share_pct: int  # the most one team may hold, % of the tier
    share_gpus: int  # the same in GPUs of what is offered now


def bid_warnings(
    *,
    quantity: int,
    min_quantity: int,
    limits: Mapping[str, int],
    guides: Mapping[str, TierGuide],
    soft_budgets: Sequence[tuple[str, int]] = (),
) -> list[str]:
    """Warnings for a bid that can be placed but may not do what its author expects.

    ``soft_budgets`` are (label, what is left after this bid) of the soft budgets that apply.
    """
    warnings = []
    for slug, price in sorted(limits.items()):
        guide = guides.get(slug)
        if guide is not None and price < guide.reserve:
            warnings.append(
                f"Your limit on {slug} ({credits(price)}) is below its reserve "
                f"({credits(guide.reserve)}): the bid cannot win GPUs there."
            )
    accepted = [guides[s] for s, p in limits.items() if s in guides and p >= guides[s].reserve]
    if accepted:
        offered = sum(g.offered for g in accepted)
        if quantity > offered:
            warnings.append(
                f"You ask for {quantity} GPUs; the tiers you accept offer {offered} in all "
                "this round."
            )
        largest = max(g.offered for g in accepted)
        if min_quantity and min_quantity > largest:
            warnings.append(
                f"All or nothing for {min_quantity} GPUs on one tier, but the largest tier you "
                f"accept offers {largest}: this bid cannot win."
            )
        capped = [g for g in accepted if g.share_pct < 100]
        if capped and len(capped) == len(accepted):
            most = sum(g.share_gpus for g in capped)
            if quantity > most:
                shown = ", ".join(f"{g.slug} {g.share_pct} % = {g.share_gpus}" for g in capped)
                warnings.append(
                    f"Your team may hold at most {most} GPUs of the tiers you accept ({shown}); "
                    f"you ask for {quantity}."
                )
    for label, after in soft_budgets:
        if after < 0:
            warnings.append(
                f"This bid could take your {label} soft budget {credits(-after)} credits over "
                "its cap: you will get alerts; the bid is not refused."
            )
    return warnings
