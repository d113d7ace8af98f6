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

TIER_FIELDS = (
    "name",
    "gpu_model",
    "capacity",
    "maintenance_gpus",
    "preemptible",
    "active",
    "energy_price",
    "power_cap_w",
)
# The largest energy price, in milli-credits per kWh (a million credits per kWh), and the
# power caps an agent can set (NVML boards accept tens to hundreds of watts).
MAX_ENERGY_PRICE = 10**9
POWER_CAP_MIN_W = 10
POWER_CAP_MAX_W = 10_000
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
        elif name == "energy_price":
            # Milli-credits per kWh.
            value = (
                0
                if value is None
                else whole(value, field=name, minimum=0, maximum=MAX_ENERGY_PRICE)
            )
        elif name == "power_cap_w":
            if value is not None:
                value = whole(value, field=name, minimum=POWER_CAP_MIN_W, maximum=POWER_CAP_MAX_W)
        else:
            value = str(value or "").strip()[:120]
        clean[name] = value
    if "name" in clean and not clean["name"]:
        raise MarketError("a tier needs a name")
    # Set together (the staff forms send both): GPUs in maintenance come out of the capacity.
    # Telemetry sets the capacity alone, as the GPUs it measures, and is not refused.
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
    energy_price: int = 0,
    power_cap_w: int | None = None,
) -> Tier:
    tier_slug_validate(slug)
    fields = tier_changes_validate(
        {
            "name": name or slug,
            "gpu_model": gpu_model,
            "capacity": capacity,
            "maintenance_gpus": maintenance_gpus,
            "preemptible": preemptible,
            "energy_price": energy_price,
            "power_cap_w": power_cap_w,
        }
    )
    tier = Tier.objects.create(slug=slug, **fields)
    audit.record(actor=actor, action="tier.create", target=tier, after=_snapshot(tier))
    return tier


@transaction.atomic
def tier_update(*, tier: Tier, actor: AbstractBaseUser | str | None, **changes: Any) -> Tier:
    """Change a tier's name, model, maintenance GPUs, preemptible or active flag, or lower its
    capacity.

    A change applies to rounds cleared after it (capacity is read when a round clears). The
    capacity is measured (``tier_capacity_set``): an admin may lower what a tier offers, with
    ``maintenance_gpus``, never raise it above the GPUs healthy nodes report.
    """
    clean = tier_changes_validate(changes)
    return _tier_change(tier=tier, actor=actor, clean=clean, measured=False)


def _tier_change(
    *, tier: Tier, actor: AbstractBaseUser | str | None, clean: dict[str, Any], measured: bool
) -> Tier:
    locked = Tier.objects.select_for_update(no_key=True).get(pk=tier.pk)
    if not measured and clean.get("capacity", locked.capacity) > locked.capacity:
        raise MarketError(
            f"capacity: a tier's capacity is measured from the healthy GPUs its nodes report "
            f"({locked.capacity} now) and cannot be raised by hand; register a node, or lower "
            f"what the tier offers with maintenance_gpus"
        )
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


@transaction.atomic
def tier_capacity_set(
    *, tier: Tier, capacity: int, actor: AbstractBaseUser | str | None = "telemetry"
) -> Tier:
    """Set the measured capacity: the tier's GPUs on healthy nodes, not in maintenance, less
    those held by running work of longer windows (telemetry calls this on every health pass;
    unchanged = no write, so the audit log records changes only). The only way up."""
    clean = tier_changes_validate({"capacity": capacity})
    return _tier_change(tier=tier, actor=actor, clean=clean, measured=True)
