"""Market policy versions: create (never edit), activate, shadow."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max, Q

import audit.services as audit
from core.validation import fields_known
from market.errors import MarketError
from market.models import PolicyVersion, Tier
from market.selectors import policy_active_get
from market.services._common import MAX_PRICE, now_or, whole

Status = PolicyVersion.Status

# The fields a new version may change; everything else (number, status, parent, audit
# columns) belongs to the service.
POLICY_FIELDS = (
    "mechanism",
    "params",
    "reserve_prices",
    "max_share_pct",
    "round_minutes",
    "lead_minutes",
    "guardrails",
    "note",
)
MAX_ROUND_MINUTES = 7 * 24 * 60
DEFAULT_ROUND_MINUTES = 60
POLICY_UNKNOWN = "cannot set {unknown} on a policy version; settable: {known}"


def _tier_slugs() -> set[str]:
    return set(Tier.objects.values_list("slug", flat=True))


def _per_tier(value: Any, *, field: str, minimum: int, maximum: int) -> dict[str, int]:
    if not isinstance(value, dict):
        raise MarketError(
            f"{field} must be a mapping of tier slug to a whole number, got {value!r}"
        )
    known = _tier_slugs()
    unknown = sorted(set(value) - known)
    if unknown:
        raise MarketError(
            f"{field} names unknown tier(s) {', '.join(unknown)}; known tiers: "
            f"{', '.join(sorted(known)) or 'none yet'}"
        )
    return {
        slug: whole(amount, field=f"{field}[{slug}]", minimum=minimum, maximum=maximum)
        for slug, amount in sorted(value.items())
    }


# params["idle_reclaim"]: {tier slug: {setting: whole number}} (market/services/reclaim.py).
IDLE_RECLAIM = "idle_reclaim"
# params the platform reads itself, never the clearing mechanism's (which refuses a key it
# does not know): every caller of the clearing leaves them out.
PLATFORM_PARAMS = (IDLE_RECLAIM, "backfill_minutes")
IDLE_RECLAIM_SETTINGS = {
    # A GPU is idle while its utilisation stays below this percentage...
    "below_pct": (1, 100),
    # ...for this many minutes; then its team is told,
    "idle_minutes": (1, 24 * 60),
    # and after this many more minutes still idle it is reclaimed,
    "grace_minutes": (0, 24 * 60),
    # its unused time refunded at this percentage of the price it paid.
    "refund_pct": (0, 100),
}


def idle_reclaim_validate(value: Any) -> dict[str, dict[str, int]]:
    """The cleaned idle-reclaim policy; MarketError names the tier and setting at fault."""
    field = f"params.{IDLE_RECLAIM}"
    example = '{"a100": {"below_pct": 5, "idle_minutes": 15, "grace_minutes": 5, "refund_pct": 50}}'
    if not isinstance(value, dict):
        raise MarketError(f"{field} must map tier slugs to settings, e.g. {example}; got {value!r}")
    known = _tier_slugs()
    unknown = sorted(set(value) - known)
    if unknown:
        raise MarketError(
            f"{field} names unknown tier(s) {', '.join(unknown)}; known tiers: "
            f"{', '.join(sorted(known)) or 'none yet'}"
        )
    clean = {}
    for slug, settings in sorted(value.items()):
        if not isinstance(settings, dict):
            raise MarketError(f"{field}[{slug}] must be a mapping like {example}; got {settings!r}")
        fields_known(
            settings,
            known=tuple(IDLE_RECLAIM_SETTINGS),
            message=f"cannot set {{unknown}} in {field}[{slug}]; settable: {{known}}",
            error=MarketError,
        )
        missing = sorted(set(IDLE_RECLAIM_SETTINGS) - set(settings))
        if missing:
            raise MarketError(f"{field}[{slug}] needs {', '.join(missing)}, e.g. {example}")
        clean[slug] = {
            key: whole(settings[key], field=f"{field}[{slug}].{key}", minimum=low, maximum=high)
            for key, (low, high) in IDLE_RECLAIM_SETTINGS.items()
        }
    return clean


def policy_changes_validate(changes: dict[str, Any]) -> dict[str, Any]:
    """The cleaned changes for a new version; MarketError names the first bad one (forms call
    this in ``clean`` so an admin sees the message next to the form)."""
    fields_known(changes, known=POLICY_FIELDS, message=POLICY_UNKNOWN, error=MarketError)
    clean: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "mechanism":
            if value not in PolicyVersion.Mechanism.values:
                raise MarketError(
                    f"mechanism must be one of {', '.join(PolicyVersion.Mechanism.values)}, got {value!r}"
                )
        elif name == "reserve_prices":
            value = _per_tier(value, field=name, minimum=0, maximum=MAX_PRICE)
        elif name == "max_share_pct":
            value = _per_tier(value, field=name, minimum=1, maximum=100)
        elif name == "round_minutes":
            value = whole(value, field=name, minimum=1, maximum=MAX_ROUND_MINUTES)
        elif name == "lead_minutes":
            value = whole(value, field=name, minimum=0, maximum=MAX_ROUND_MINUTES)
        elif name in ("params", "guardrails"):
            if not isinstance(value, dict):
                raise MarketError(f"{name} must be a mapping, got {value!r}")
            if name == "params" and "backfill_minutes" in value:
                whole(
                    value["backfill_minutes"],
                    field="params.backfill_minutes",
                    minimum=1,
                    maximum=60,
                )
            if name == "params" and IDLE_RECLAIM in value:
                value = value | {IDLE_RECLAIM: idle_reclaim_validate(value[IDLE_RECLAIM])}
        elif name == "note":
            value = str(value or "").strip()[:300]
        clean[name] = value
    return clean


def _snapshot(version: PolicyVersion) -> dict[str, Any]:
    return {name: getattr(version, name) for name in POLICY_FIELDS} | {
        "number": version.number,
        "status": version.status,
        "parent": version.parent.number if version.parent_id else None,
    }


def _default_create() -> PolicyVersion:
    try:
        with transaction.atomic():
            version = PolicyVersion.objects.create(
                number=1,
                mechanism=PolicyVersion.Mechanism.WELFARE,
                round_minutes=DEFAULT_ROUND_MINUTES,
                status=Status.ACTIVE,
                note="default policy, created on first use",
                activated_at=now_or(None),
            )
            audit.record(
                actor="system",
                action="policy.default_create",
                target=version,
                after=_snapshot(version),
            )
            return version
    except IntegrityError:
        # Another process created the default at the same moment.
        return PolicyVersion.objects.get(status=Status.ACTIVE)


def policy_active() -> PolicyVersion:
    """The active policy version. On a fresh platform (no version at all) the default v1
    (welfare, 60-minute rounds) is created and activated."""
    active = policy_active_get()
    if active is not None:
        return active
    if PolicyVersion.objects.exists():
        raise MarketError(
            "no policy version is active; activate one under Market > Policy versions"
        )
    return _default_create()


def policy_shadow() -> PolicyVersion | None:
    return PolicyVersion.objects.filter(status=Status.SHADOW).first()


@transaction.atomic
def policy_version_create(
    *,
    actor: AbstractBaseUser | str | None,
    based_on: PolicyVersion | None = None,
    **changes: Any,
) -> PolicyVersion:
    """A new draft version: ``based_on``'s settings (or the defaults) with ``changes`` applied.

    Existing versions are never edited; the new one records ``based_on`` as its parent.
    """
    clean = policy_changes_validate(changes)
    fields: dict[str, Any] = {}
    if based_on is not None:
        fields = {name: getattr(based_on, name) for name in POLICY_FIELDS}
        fields["note"] = ""
    fields.update(clean)
    # Version numbers are unique; a concurrent create takes the number first and this one
    # retries with the next (each attempt in a savepoint so the outer transaction survives).
    for _attempt in range(5):
        number = (PolicyVersion.objects.aggregate(n=Max("number"))["n"] or 0) + 1
        try:
            with transaction.atomic():
                version = PolicyVersion.objects.create(
                    number=number,
                    status=Status.DRAFT,
                    parent=based_on,
                    created_by=actor if isinstance(actor, AbstractBaseUser) else None,
                    **fields,
                )
            break
        except IntegrityError:
            continue
    else:
        raise MarketError(
            "could not number the new policy version (too many concurrent edits); retry"
        )
    audit.record(
        actor=actor,
        action="policy.version_create",
        target=version,
        before=_snapshot(based_on) if based_on is not None else None,
        after=_snapshot(version),
    )
    return version


def _lock(*, extra_pk: int | None) -> list[PolicyVersion]:
    """Lock the active and shadow versions (and ``extra_pk``) in primary-key order."""
    condition = Q(status__in=[Status.ACTIVE, Status.SHADOW])
    if extra_pk is not None:
        condition |= Q(pk=extra_pk)
    return list(PolicyVersion.objects.select_for_update().filter(condition).order_by("pk"))


@transaction.atomic
def policy_activate(
    *, version: PolicyVersion, actor: AbstractBaseUser | str | None, now: datetime | None = None
) -> PolicyVersion:
    """Make ``version`` the one active version; the previous active one is retired.

    Applies from the next round opened: a round keeps the policy it was opened (and bid) under.
    A retired version is not re-activated; make a new version based on it (that is a rollback).
    """
    locked = {v.pk: v for v in _lock(extra_pk=version.pk)}
    target = locked.get(version.pk)
    if target is None:
        raise MarketError(f"policy version {version.pk} does not exist")
    if target.status == Status.ACTIVE:
        return target
    if target.status == Status.RETIRED:
        raise MarketError(
            f"v{target.number} is retired; create a new version based on it and activate that"
        )
    previous = next((v for v in locked.values() if v.status == Status.ACTIVE), None)
    if previous is not None:
        # Retire first: the database allows one active row at a time.
        previous.status = Status.RETIRED
        previous.save(update_fields=["status"])
    target.status = Status.ACTIVE
    target.activated_at = now_or(now)
    target.save(update_fields=["status", "activated_at"])
    audit.record(
        actor=actor,
        action="policy.activate",
        target=target,
        before={"active": previous.number if previous else None},
        after={"active": target.number, "mechanism": target.mechanism},
    )
    version.status, version.activated_at = target.status, target.activated_at
    return target


@transaction.atomic
def policy_shadow_set(
    *, version: PolicyVersion | None, actor: AbstractBaseUser | str | None
) -> PolicyVersion | None:
    """Run ``version`` (a draft) in shadow from now on, or stop shadowing with ``None``.

    A shadow version clears every round alongside the active one; only the active one
    settles. The version that stops being the shadow goes back to draft.
    """
    locked = _lock(extra_pk=version.pk if version is not None else None)
    current = next((v for v in locked if v.status == Status.SHADOW), None)
    target = next((v for v in locked if version is not None and v.pk == version.pk), None)
    if version is not None:
        if target is None:
            raise MarketError(f"policy version {version.pk} does not exist")
        if target.status == Status.SHADOW:
            return target
        if target.status != Status.DRAFT:
            raise MarketError(
                f"only a draft can run in shadow; v{target.number} is {target.status}"
            )
    if current is not None:
        current.status = Status.DRAFT
        current.save(update_fields=["status"])
    if target is not None:
        target.status = Status.SHADOW
        target.save(update_fields=["status"])
        version.status = Status.SHADOW
    audit.record(
        actor=actor,
        action="policy.shadow_set",
        target=target or current,
        object_type="" if (target or current) else "market.policyversion",
        before={"shadow": current.number if current else None},
        after={"shadow": target.number if target else None},
    )
    return target
