"""The automatic rollback a guardrail breach triggers (the limits and the checks are in
``market/policy/guardrails.py``).

After each settlement ``round_process`` calls ``guardrails_enforce``, which checks the round
against the limits of the version it cleared under; a breach creates a new version with the
content of the version that was active before (history stays linear: the new version's parent
is the one rolled back), activates it, moves rounds not yet cleared onto it, notifies admins
and audits the numbers that triggered it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from audit.models import AuditEvent
from market.errors import MarketError
from market.models import PolicyVersion, Round
from market.policy.guardrails import Breach, guardrails_check
from market.services.policy import POLICY_FIELDS, policy_activate, policy_version_create
from market.services.void import round_void
from tenants.models import Notification

GUARDRAIL = "guardrail"


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
        _breach_report(active, previous=previous, breaches=breaches, actor=actor)
        return None
    restored, moved = _restore(active, previous=previous, summary=summary, actor=actor)
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


def _breach_report(
    active: PolicyVersion,
    *,
    previous: PolicyVersion | None,
    breaches: list[Breach],
    actor: AbstractBaseUser | str | None,
) -> None:
    """A breach that is not rolled back (the version is itself a rollback, or nothing was
    active before it): admins are told and the breach is audited."""
    why = (
        "it is itself a rollback" if previous is not None else "no earlier version was ever active"
    )
    first = min(b.round_id for b in breaches)
    summary = "; ".join(b.message for b in breaches)
    _notify_admins(
        message=f"Guardrail breached by v{active.number} in round {first}, not rolled back ({why}): {summary}",
        key=f"guardrail-breach:{active.pk}:{first}",
    )
    audit.record(
        actor=actor,
        action="policy.guardrail_breach",
        target=active,
        after={"rolled_back": False, "why": why, "breaches": [b.as_json() for b in breaches]},
    )


def _restore(
    active: PolicyVersion,
    *,
    previous: PolicyVersion,
    summary: str,
    actor: AbstractBaseUser | str | None,
) -> tuple[PolicyVersion, list[int]]:
    """A new version with ``previous``'s settings, activated; the rounds opened under the
    breaching version but not yet cleared move to it (their bids are the same whichever
    version clears them). Returns the new version and the rounds moved."""
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
    moved = list(
        Round.objects.select_for_update()
        .filter(policy=active, status__in=[Round.Status.OPEN, Round.Status.CLOSED])
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    Round.objects.filter(pk__in=moved).update(policy=restored)
    return restored, moved


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
