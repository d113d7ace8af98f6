"""Tiers (pools of like GPUs): created and changed by admins; capacity also by telemetry."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils.text import slugify

import audit.services as audit
from core.validation import fields_known
from market.errors import MarketError
from market.models import Tier
from market.services._common import MAX_GPUS, whole

TIER_FIELDS = ("name", "gpu_model", "capacity", "maintenance_gpus", "preemptible", "active")
TIER_UNKNOWN = "cannot set {unknown} on a tier; settable: {known}"


def tier_changes_validate(changes: dict[str, Any]) -> dict[str, Any]:
    """The cleaned tier fields; MarketError names the first bad one."""
    fields_known(changes, known=TIER_FIELDS, message=TIER_UNKNOWN, error=MarketError)
    clean: dict[str, Any] = {}
    for name, value in changes.items():
        if name in ("capacity", "maintenance_gpus"):
            value = whole(value, field=name, minimum=0, maximum=MAX_GPUS)
        elif name in ("preemptible", "active"):
            if not isinstance(value, bool):
                raise MarketError(f"{name} must be true or false, got {value!r}")
        else:
            value = str(value or "").strip()[:120]
        clean[name] = value
    if "name" in clean and not clean["name"]:
        raise MarketError("a tier needs a name")
    # Set together (the staff forms send both): GPUs in maintenance come out of the capacity.
    # Telemetry sets the capacity alone, as the GPUs it sees healthy, and is not refused.
    if clean.get("maintenance_gpus", 0) > clean.get("capacity", clean.get("maintenance_gpus", 0)):
        raise MarketError(
            f"maintenance_gpus: {clean['maintenance_gpus']} GPUs in maintenance is more than the "
            f"tier's capacity of {clean['capacity']}; at most {clean['capacity']}"
        )
    return clean


def tier_slug_validate(slug: str) -> str:
    clean_slug = slugify(slug or "")
    if not clean_slug or clean_slug != slug:
        raise MarketError(
            f"tier slug {slug!r} must be lower-case letters, digits and hyphens (e.g. {clean_slug or 'a100'!r})"
        )
    if Tier.objects.filter(slug=slug).exists():
        raise MarketError(f"a tier {slug!r} already exists")
    return slug


def _snapshot(tier: Tier) -> dict[str, Any]:
    return {name: getattr(tier, name) for name in TIER_FIELDS} | {"slug": tier.slug}


@transaction.atomic
def tier_create(
    *,
    actor: AbstractBaseUser | str | None,
    slug: str,
    name: str = "",
    capacity: int = 0,
    maintenance_gpus: int = 0,
    gpu_model: str = "",
    preemptible: bool = False,
) -> Tier:
    tier_slug_validate(slug)
    fields = tier_changes_validate(
        {
            "name": name or slug,
            "gpu_model": gpu_model,
            "capacity": capacity,
            "maintenance_gpus": maintenance_gpus,
            "preemptible": preemptible,
        }
    )
    tier = Tier.objects.create(slug=slug, **fields)
    audit.record(actor=actor, action="tier.create", target=tier, after=_snapshot(tier))
    return tier


@transaction.atomic
def tier_update(*, tier: Tier, actor: AbstractBaseUser | str | None, **changes: Any) -> Tier:
    """Change a tier's name, model, capacity, maintenance GPUs, preemptible or active flag.

    A change applies to rounds cleared after it (capacity is read when a round clears).
    """
    clean = tier_changes_validate(changes)
    locked = Tier.objects.select_for_update().get(pk=tier.pk)
    before = _snapshot(locked)
    changed = [name for name, value in clean.items() if getattr(locked, name) != value]
    if not changed:
        return locked
    for name in changed:
        setattr(locked, name, clean[name])
    locked.save(update_fields=changed)
    audit.record(
        actor=actor, action="tier.update", target=locked, before=before, after=_snapshot(locked)
    )
    for name in changed:
        setattr(tier, name, clean[name])
    return locked


def tier_capacity_set(
    *, tier: Tier, capacity: int, actor: AbstractBaseUser | str | None = "telemetry"
) -> Tier:
    """Set the healthy capacity (telemetry calls this on every health pass; unchanged = no write,
    so the audit log records changes only)."""
    return tier_update(tier=tier, actor=actor, capacity=capacity)
