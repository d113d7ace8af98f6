"""Guardrails on the active policy version: the limits an admin may set and the checks of a
settled round against them. Reads only; the rollback a breach triggers is the service
``market.services.guardrails.guardrails_enforce``.

An admin sets limits in ``PolicyVersion.guardrails`` (all optional):

``price_max_multiple``      a tier's clearing price may be at most N x the median of its
                            price over the previous ``price_window_rounds`` settled rounds
                            (default 24; at least ``price_min_history`` of them, default 3)
``utilisation_min``         fraction (0..1) of the GPUs that could have been used (the lesser
                            of those offered and those asked for) that must be allocated
``jain_min``                the round's Jain's index across tenants (0..1) must be at least this
``spend_max_per_window``    platform revenue (milli-credits) over the trailing
                            ``spend_window_hours`` (default 24) must be at most this
``void_on_breach``          true: a breaching round is also voided (charges refunded)
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Sum

from core.validation import fields_known
from market.diagnostics import JAIN, diagnostic
from market.errors import MarketError
from market.models import Allocation, Bid, Round

SETTLED = (Round.Status.SETTLED, Round.Status.FINISHED)
DEFAULTS: dict[str, Any] = {
    "price_window_rounds": 24,
    "price_min_history": 3,
    "spend_window_hours": 24,
}
# name -> (kind, minimum, maximum); None = unbounded.
GUARDRAIL_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "price_max_multiple": (float, 1.0, None),
    "price_window_rounds": (int, 1, 1000),
    "price_min_history": (int, 1, 1000),
    "utilisation_min": (float, 0.0, 1.0),
    "jain_min": (float, 0.0, 1.0),
    "spend_max_per_window": (int, 1, None),
    "spend_window_hours": (int, 1, 24 * 366),
    "void_on_breach": (bool, None, None),
}
GUARDRAIL_UNKNOWN = "unknown guardrail(s) {unknown}; known: {known}"


@dataclass(frozen=True)
class Breach:
    """One limit a round broke, with the numbers that show it."""

    rule: str
    observed: float
    limit: float
    message: str
    policy_id: int
    round_id: int
    tier: str = ""
    reference: dict[str, Any] | None = None  # e.g. the trailing median and the rounds it used

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


def guardrails_validate(value: Any) -> dict[str, Any]:
    """A clean guardrails mapping, or MarketError naming the field to fix."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        raise MarketError(f"guardrails must be a mapping of limit name to value, got {value!r}")
    fields_known(value, known=GUARDRAIL_FIELDS, message=GUARDRAIL_UNKNOWN, error=MarketError)
    clean: dict[str, Any] = {}
    for name, raw in value.items():
        if raw is None:
            continue
        kind, low, high = GUARDRAIL_FIELDS[name]
        if kind is bool:
            if not isinstance(raw, bool):
                raise MarketError(f"guardrail {name} must be true or false, got {raw!r}")
            clean[name] = raw
            continue
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise MarketError(f"guardrail {name} must be a number, got {raw!r}")
        if kind is int and raw != int(raw):
            raise MarketError(f"guardrail {name} must be a whole number, got {raw!r}")
        number = kind(raw)
        if low is not None and number < low:
            raise MarketError(f"guardrail {name} must be at least {low}, got {raw}")
        if high is not None and number > high:
            raise MarketError(f"guardrail {name} must be at most {high}, got {raw}")
        clean[name] = number
    return clean


def _setting(limits: dict[str, Any], name: str) -> Any:
    return limits.get(name, DEFAULTS.get(name))


def _price_breaches(rnd: Round, limits: dict[str, Any]) -> list[Breach]:
    multiple = limits.get("price_max_multiple")
    if multiple is None or not rnd.prices:
        return []
    window = int(_setting(limits, "price_window_rounds"))
    min_history = int(_setting(limits, "price_min_history"))
    history = list(
        Round.objects.filter(status__in=SETTLED, starts_at__lt=rnd.starts_at)
        .exclude(pk=rnd.pk)
        .order_by("-starts_at")
        .values_list("pk", "prices")[:window]
    )
    breaches = []
    for slug, price in sorted(rnd.prices.items()):
        past = [float(p[slug]) for _, p in history if slug in p]
        if len(past) < min_history:
            continue
        median = statistics.median(past)
        # A zero median means no competition at all in the window; any multiple of it is
        # zero, so the rule has nothing to compare against and stays silent.
        if median <= 0 or float(price) <= multiple * median:
            continue
        breaches.append(
            Breach(
                rule="price_max_multiple",
                tier=slug,
                observed=float(price),
                limit=multiple * median,
                message=(
                    f"price on {slug} was {price} milli-credits/GPU-h, more than {multiple:g} x "
                    f"the trailing median {median:g} of the last {len(past)} rounds"
                ),
                policy_id=rnd.policy_id,
                round_id=rnd.pk,
                reference={"median": median, "rounds": len(past), "multiple": multiple},
            )
        )
    return breaches


def round_utilisation(rnd: Round) -> dict[str, int | float | None]:
    """GPUs allocated / the lesser of GPUs offered and GPUs asked for (None if neither)."""
    offered = sum(int(v) for v in (rnd.capacities or {}).values())
    asked = (
        Bid.objects.filter(round=rnd)
        .exclude(status=Bid.Status.CANCELLED)
        .aggregate(n=Sum("quantity"))["n"]
        or 0
    )
    allocated = Allocation.objects.filter(round=rnd).aggregate(n=Sum("gpus"))["n"] or 0
    usable = min(offered, asked)
    return {
        "offered": offered,
        "asked": asked,
        "allocated": allocated,
        "utilisation": (allocated / usable) if usable else None,
    }


def _utilisation_breach(rnd: Round, limits: dict[str, Any]) -> list[Breach]:
    floor = limits.get("utilisation_min")
    if floor is None:
        return []
    numbers = round_utilisation(rnd)
    value = numbers["utilisation"]
    if value is None or value >= floor:
        return []
    return [
        Breach(
            rule="utilisation_min",
            observed=float(value),
            limit=float(floor),
            message=(
                f"only {numbers['allocated']} of {min(numbers['offered'], numbers['asked'])} usable GPUs "
                f"were allocated ({value:.0%}, floor {floor:.0%})"
            ),
            policy_id=rnd.policy_id,
            round_id=rnd.pk,
            reference=dict(numbers),
        )
    ]


def _jain_breach(rnd: Round, limits: dict[str, Any]) -> list[Breach]:
    floor = limits.get("jain_min")
    value = diagnostic(rnd.diagnostics, JAIN)
    if floor is None or value is None or float(value) >= floor:
        return []
    return [
        Breach(
            rule="jain_min",
            observed=float(value),
            limit=float(floor),
            message=f"Jain's fairness index was {float(value):.3f}, below the floor {floor:.3f}",
            policy_id=rnd.policy_id,
            round_id=rnd.pk,
        )
    ]


def _spend_breach(rnd: Round, limits: dict[str, Any]) -> list[Breach]:
    cap = limits.get("spend_max_per_window")
    if cap is None or rnd.settled_at is None:
        return []
    hours = int(_setting(limits, "spend_window_hours"))
    since = rnd.settled_at - timedelta(hours=hours)
    spent = (
        Round.objects.filter(
            status__in=SETTLED, settled_at__gt=since, settled_at__lte=rnd.settled_at
        ).aggregate(total=Sum("revenue"))["total"]
        or 0
    )
    if spent <= cap:
        return []
    return [
        Breach(
            rule="spend_max_per_window",
            observed=float(spent),
            limit=float(cap),
            message=(
                f"platform revenue over the last {hours} h reached {spent} milli-credits, above the "
                f"limit of {cap}"
            ),
            policy_id=rnd.policy_id,
            round_id=rnd.pk,
            reference={"window_hours": hours, "since": since.isoformat()},
        )
    ]


def guardrails_check(*, round: Round) -> list[Breach]:  # noqa: A002 - the domain's word
    """Every guardrail of the version ``round`` cleared under that the round broke.

    Only a settled (or finished) round is judged: before settlement there are no allocations,
    and a voided or failed round charged nobody.
    """
    rnd = Round.objects.select_related("policy").get(pk=round.pk)
    if rnd.status not in SETTLED:
        return []
    limits = rnd.policy.guardrails or {}
    return [
        *_price_breaches(rnd, limits),
        *_utilisation_breach(rnd, limits),
        *_jain_breach(rnd, limits),
        *_spend_breach(rnd, limits),
    ]
