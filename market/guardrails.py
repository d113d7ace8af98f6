"""Guardrails on the active policy version, and the automatic rollback they trigger.

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

After each settlement ``guardrails_enforce`` checks the round against the limits of the
version it cleared under; a breach creates a new version with the content of the version
that was active before (history stays linear: the new version's parent is the one rolled
back), activates it, moves rounds not yet cleared onto it, notifies admins and audits the
numbers that triggered it.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Sum

import audit.services as audit
from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Allocation, Bid, PolicyVersion, Round
from market.services.policy import POLICY_FIELDS, policy_activate, policy_version_create
from market.services.void import round_void
from tenants.models import Notification

logger = logging.getLogger(__name__)

GUARDRAIL = "guardrail"
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
    unknown = sorted(set(value) - set(GUARDRAIL_FIELDS))
    if unknown:
        raise MarketError(
            f"unknown guardrail(s) {', '.join(unknown)}; known: {', '.join(GUARDRAIL_FIELDS)}"
        )
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
    diagnostics = rnd.diagnostics or {}
    value = diagnostics.get("jain", diagnostics.get("jain_index"))
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


def _is_rollback(version: PolicyVersion) -> bool:
    return AuditEvent.objects.filter(
        action="policy.rollback", object_type="market.policyversion", object_id=str(version.pk)
    ).exists()


def _previous_active(version: PolicyVersion) -> PolicyVersion | None:
    """The version that was active before ``version`` was activated."""
    if version.activated_at is None:
        return None
    return (
        PolicyVersion.objects.filter(activated_at__lt=version.activated_at)
        .exclude(pk=version.pk)
        .order_by("-activated_at", "-pk")
        .first()
    )


def _notify_admins(*, message: str, key: str, level: str = Notification.Level.CRITICAL) -> None:
    Notification.objects.bulk_create(
        [
            Notification(
                tenant=None,
                level=level,
                kind="policy_guardrail",
                message=message[:500],
                dedupe_key=key,
            )
        ],
        ignore_conflicts=True,
    )


@transaction.atomic
def policy_rollback(
    *, breaches: list[Breach], actor: AbstractBaseUser | str | None = GUARDRAIL
) -> PolicyVersion | None:
    """Roll the active version back to the one active before it, because of ``breaches``.

    Returns the new active version, or None when nothing was rolled back: the breaches are
    about a version that is no longer active (someone already acted), or there is nothing to
    go back to. A version that is itself a rollback is not rolled back again (that would
    return to the version that just breached); its breach is reported to admins instead.
    """
    if not breaches:
        raise MarketError("a rollback needs at least one breach to say why")
    policy_ids = {b.policy_id for b in breaches}
    if len(policy_ids) != 1:
        raise MarketError("breaches of different policy versions cannot be rolled back together")
    active = (
        PolicyVersion.objects.select_for_update().filter(status=PolicyVersion.Status.ACTIVE).first()
    )
    if active is None or active.pk != policy_ids.pop():
        return None
    summary = "; ".join(b.message for b in breaches)
    round_ids = sorted({b.round_id for b in breaches})
    previous = _previous_active(active)
    if previous is None or _is_rollback(active):
        why = (
            "it is itself a rollback"
            if previous is not None
            else "no earlier version was ever active"
        )
        _notify_admins(
            message=f"Guardrail breached by v{active.number} in round {round_ids[0]}, not rolled back ({why}): {summary}",
            key=f"guardrail-breach:{active.pk}:{round_ids[0]}",
        )
        audit.record(
            actor=actor,
            action="policy.guardrail_breach",
            target=active,
            after={"rolled_back": False, "why": why, "breaches": [b.as_json() for b in breaches]},
        )
        return None

    content = {name: getattr(previous, name) for name in POLICY_FIELDS if name != "note"}
    restored = policy_version_create(
        actor=actor,
        based_on=active,
        note=f"automatic rollback of v{active.number} to the settings of v{previous.number}: {summary}"[
            :300
        ],
        **content,
    )
    policy_activate(version=restored, actor=actor)
    # Rounds opened under the breaching version but not yet cleared clear under the restored
    # one: their bids are the same whichever version clears them.
    moved = list(
        Round.objects.select_for_update()
        .filter(policy=active, status__in=[Round.Status.OPEN, Round.Status.CLOSED])
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    Round.objects.filter(pk__in=moved).update(policy=restored)
    _notify_admins(
        message=(
            f"Policy v{active.number} was rolled back automatically to the settings of "
            f"v{previous.number} (now v{restored.number}) after round {round_ids[0]}: {summary}"
        ),
        key=f"policy-rollback:{active.pk}",
    )
    audit.record(
        actor=actor,
        action="policy.rollback",
        target=restored,
        before={"active": active.number, "mechanism": active.mechanism},
        after={
            "active": restored.number,
            "restored_from": previous.number,
            "rounds": round_ids,
            "rounds_moved": moved,
            "breaches": [b.as_json() for b in breaches],
        },
    )
    return restored


@dataclass(frozen=True)
class GuardrailOutcome:
    breaches: list[Breach]
    restored: PolicyVersion | None
    voided: bool


@transaction.atomic
def guardrails_enforce(*, round: Round) -> GuardrailOutcome:  # noqa: A002
    """Check a settled round and act on any breach: roll back, and void the round if the
    version says so. One transaction, so a failure leaves the policy as it was."""
    breaches = guardrails_check(round=round)
    if not breaches:
        return GuardrailOutcome(breaches=[], restored=None, voided=False)
    rnd = Round.objects.select_related("policy").get(pk=round.pk)
    restored = policy_rollback(breaches=breaches, actor=GUARDRAIL)
    voided = False
    if (rnd.policy.guardrails or {}).get("void_on_breach"):
        round_void(
            round=rnd,
            actor=GUARDRAIL,
            reason="guardrail breach: " + "; ".join(b.message for b in breaches),
        )
        voided = True
    return GuardrailOutcome(breaches=breaches, restored=restored, voided=voided)


def guardrails_after_settlement(*, round_ids: list[int]) -> dict[int, GuardrailOutcome]:
    """Run ``guardrails_enforce`` on each newly settled round (for the market tasks).

    One round's failure is logged and does not stop the others; the policy stays as it was
    for that round (its transaction rolled back) and the admins are told by the log.
    """
    outcomes: dict[int, GuardrailOutcome] = {}
    for round_id in sorted(round_ids):
        try:
            outcomes[round_id] = guardrails_enforce(round=Round(pk=round_id))
        except Exception:  # noqa: BLE001 - isolate one round, as the tick does
            logger.exception(
                "round %s: guardrail check failed; the policy was left as it is", round_id
            )
    return outcomes
