"""What each kind of change request checks when asked for and does when approved.

``prepare`` reads and checks the requested change (a GovernanceError names the bad field) and
returns what it changes from; ``apply`` makes it through the owning app's service, inside the
approval's transaction, after checking that what it changes from has not moved meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from core.errors import DomainError
from governance.errors import GovernanceError
from governance.models import ChangeRequest
from market.models import PolicyVersion, Tier
from market.services.policy import policy_activate
from market.services.tiers import tier_changes_validate, tier_update
from tenants.budgets import budget_set
from tenants.ledger import credits, credits_grant
from tenants.ledger.transfers import amount_validate
from tenants.models import Budget, Campaign, Tenant
from tenants.services import tenant_weight_set, weight_validate

Kind = ChangeRequest.Kind


@dataclass(frozen=True)
class Prepared:
    payload: dict[str, Any]
    tenant: Tenant | None
    before: dict[str, Any] | None
    summary: str
    # Milli-credits, for the rule's threshold: a grant's amount, a budget's raise.
    amount: int | None = None
    raise_by: int | None = None


@dataclass(frozen=True)
class KindSpec:
    prepare: Callable[[dict[str, Any]], Prepared]
    apply: Callable[[ChangeRequest, AbstractBaseUser], dict[str, Any]]


def _int(payload: dict[str, Any], field: str) -> int:
    value = payload.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GovernanceError(f"{field}: a whole number is required, got {value!r}")
    return value


def _row(model, pk: object, field: str):
    try:
        return model.objects.get(pk=pk)
    except (model.DoesNotExist, ValueError, TypeError) as exc:
        raise GovernanceError(f"{field}: no {model._meta.verbose_name} {pk!r}") from exc


def _unchanged(req: ChangeRequest, now: dict[str, Any], what: str) -> None:
    if now != req.before:
        raise GovernanceError(
            f"{what} changed since this request was made ({req.before} then, {now} now); "
            "reject it and request the change again"
        )


def _reason(req: ChangeRequest, approver: AbstractBaseUser) -> str:
    return (
        f"{req.payload['reason']} (change request #{req.pk}: asked by "
        f"{req.requested_by.get_username()}, approved by {approver.get_username()})"
    )[:300]


# Credits ------------------------------------------------------------------------------------


def _grant_prepare(payload: dict[str, Any]) -> Prepared:
    tenant = _row(Tenant, payload.get("tenant"), "tenant")
    try:
        amount = amount_validate(payload.get("amount"))
    except DomainError as exc:
        raise GovernanceError(str(exc)) from exc
    reason = str(payload.get("reason") or "").strip()[:200]
    if not reason:
        raise GovernanceError("reason: a credit grant needs a reason (recorded in the ledger)")
    return Prepared(
        payload={"tenant": tenant.pk, "amount": amount, "reason": reason},
        tenant=tenant,
        before=None,
        summary=f"Grant {credits(amount)} credits to {tenant.name}: {reason}",
        amount=amount,
    )


def _grant_apply(req: ChangeRequest, approver: AbstractBaseUser) -> dict[str, Any]:
    transfer = credits_grant(
        tenant=req.tenant,
        amount=req.payload["amount"],
        reason=_reason(req, approver),
        actor=approver,
        idempotency_key=f"change-request:{req.pk}",
    )
    return {"transfer": transfer.pk}


# Policy -------------------------------------------------------------------------------------


def _active_number() -> int | None:
    return (
        PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE)
        .values_list("number", flat=True)
        .first()
    )


def _policy_prepare(payload: dict[str, Any]) -> Prepared:
    number = _int(payload, "version")
    version = PolicyVersion.objects.filter(number=number).first()
    if version is None:
        raise GovernanceError(f"version: no policy version v{number}")
    if version.status == PolicyVersion.Status.ACTIVE:
        raise GovernanceError(f"version: v{number} is already active")
    if version.status == PolicyVersion.Status.RETIRED:
        raise GovernanceError(
            f"version: v{number} is retired; create a new version based on it and activate that"
        )
    return Prepared(
        payload={"version": number},
        tenant=None,
        before={"active": _active_number()},
        summary=f"Activate policy v{number} ({version.get_mechanism_display()})",
    )


def _policy_apply(req: ChangeRequest, approver: AbstractBaseUser) -> dict[str, Any]:
    _unchanged(req, {"active": _active_number()}, "The active policy")
    version = PolicyVersion.objects.get(number=req.payload["version"])
    policy_activate(version=version, actor=approver)
    return {"active": version.number}


# Tiers --------------------------------------------------------------------------------------

TIER_GATED = ("capacity", "maintenance_gpus")


def _tier_prepare(payload: dict[str, Any]) -> Prepared:
    tier = _row(Tier, payload.get("tier"), "tier")
    changes = {name: payload[name] for name in TIER_GATED if name in payload}
    if not changes:
        raise GovernanceError("capacity: give the capacity or the GPUs in maintenance to set")
    merged = {name: getattr(tier, name) for name in TIER_GATED} | changes
    try:
        clean = tier_changes_validate(merged)
    except DomainError as exc:
        raise GovernanceError(str(exc)) from exc
    before = {name: getattr(tier, name) for name in TIER_GATED}
    if clean == before:
        raise GovernanceError(f"capacity: tier {tier.slug} already has these values")
    return Prepared(
        payload={"tier": tier.pk, **clean},
        tenant=None,
        before=before,
        summary=(
            f"Tier {tier.slug}: capacity {before['capacity']} -> {clean['capacity']}, "
            f"in maintenance {before['maintenance_gpus']} -> {clean['maintenance_gpus']}"
        ),
    )


def _tier_apply(req: ChangeRequest, approver: AbstractBaseUser) -> dict[str, Any]:
    tier = Tier.objects.select_for_update(no_key=True).get(pk=req.payload["tier"])
    _unchanged(req, {name: getattr(tier, name) for name in TIER_GATED}, f"Tier {tier.slug}")
    changes = {name: req.payload[name] for name in TIER_GATED}
    tier_update(tier=tier, actor=approver, **changes)
    return changes


# Budgets ------------------------------------------------------------------------------------


def _budget_prepare(payload: dict[str, Any]) -> Prepared:
    tenant = _row(Tenant, payload.get("tenant"), "tenant")
    window = payload.get("window")
    if window not in Budget.Window.values:
        raise GovernanceError(f"window: one of {Budget.Window.values}, got {window!r}")
    mode = payload.get("mode")
    if mode not in Budget.Mode.values:
        raise GovernanceError(f"mode: one of {Budget.Mode.values}, got {mode!r}")
    cap = _int(payload, "cap")
    if cap < 0:
        raise GovernanceError("cap: a cap of zero or more credits is required")
    campaign = None
    if payload.get("campaign") is not None:
        campaign = _row(Campaign, payload["campaign"], "campaign")
        if campaign.tenant_id != tenant.pk:
            raise GovernanceError(f"campaign: {campaign.name!r} is not {tenant.name}'s")
    if (window == Budget.Window.CAMPAIGN) != (campaign is not None):
        raise GovernanceError("campaign: a campaign budget needs a campaign, and only it takes one")
    current = Budget.objects.filter(
        tenant=tenant, window=window, campaign=campaign, active=True
    ).first()
    before = {"mode": current.mode, "cap": current.cap} if current else None
    # A new budget only restricts; raising an existing cap is what the rule is about.
    raise_by = cap - current.cap if current else 0
    scope = campaign.name if campaign else window
    was = credits(current.cap) if current else "none"
    return Prepared(
        payload={
            "tenant": tenant.pk,
            "window": window,
            "mode": mode,
            "cap": cap,
            "campaign": campaign.pk if campaign else None,
        },
        tenant=tenant,
        before=before,
        summary=f"{tenant.name} {scope} budget: cap {was} -> {credits(cap)} credits ({mode})",
        raise_by=raise_by,
    )


def _budget_apply(req: ChangeRequest, approver: AbstractBaseUser) -> dict[str, Any]:
    p = req.payload
    campaign = Campaign.objects.get(pk=p["campaign"]) if p["campaign"] is not None else None
    current = (
        Budget.objects.select_for_update()
        .filter(tenant=req.tenant, window=p["window"], campaign=campaign, active=True)
        .first()
    )
    now = {"mode": current.mode, "cap": current.cap} if current else None
    if now != req.before:
        _unchanged(req, now or {}, f"{req.tenant.name}'s budget")
    budget = budget_set(
        tenant=req.tenant,
        window=p["window"],
        mode=p["mode"],
        cap=p["cap"],
        campaign=campaign,
        actor=approver,
    )
    return {"budget": budget.pk, "cap": budget.cap}


# Weights ------------------------------------------------------------------------------------


def _weight_prepare(payload: dict[str, Any]) -> Prepared:
    tenant = _row(Tenant, payload.get("tenant"), "tenant")
    try:
        weight = weight_validate(payload.get("weight"))
    except DomainError as exc:
        raise GovernanceError(str(exc)) from exc
    if weight == tenant.weight:
        raise GovernanceError(f"weight: {tenant.name}'s weight is already {weight}")
    return Prepared(
        payload={"tenant": tenant.pk, "weight": weight},
        tenant=tenant,
        before={"weight": tenant.weight},
        summary=f"{tenant.name}: weight {tenant.weight} -> {weight}",
    )


def _weight_apply(req: ChangeRequest, approver: AbstractBaseUser) -> dict[str, Any]:
    tenant = Tenant.objects.select_for_update().get(pk=req.tenant_id)
    _unchanged(req, {"weight": tenant.weight}, f"{tenant.name}'s weight")
    tenant_weight_set(tenant=tenant, weight=req.payload["weight"], actor=approver)
    return {"weight": req.payload["weight"]}


KINDS: dict[str, KindSpec] = {
    Kind.CREDIT_GRANT: KindSpec(_grant_prepare, _grant_apply),
    Kind.TEAM_CREDITS: KindSpec(_grant_prepare, _grant_apply),
    Kind.POLICY_ACTIVATE: KindSpec(_policy_prepare, _policy_apply),
    Kind.TIER_CHANGE: KindSpec(_tier_prepare, _tier_apply),
    Kind.BUDGET_RAISE: KindSpec(_budget_prepare, _budget_apply),
    Kind.TENANT_WEIGHT: KindSpec(_weight_prepare, _weight_apply),
}
