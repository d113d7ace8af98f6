"""Bid and tier forms: parse what a person typed into the market services' arguments.

Limit prices are typed in credits per GPU-hour and handed on as milli-credits; the services
check the terms (quantities, tiers on offer, budgets, the round still open) and their refusals
come back as form errors.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC
from decimal import Decimal
from typing import Any

from django import forms

from core.money import SECONDS_PER_HOUR
from market.errors import MarketError
from market.models import Tier
from market.services.tiers import (
    POWER_CAP_MAX_W,
    POWER_CAP_MIN_W,
    TIER_FIELDS,
    tier_changes_validate,
    tier_slug_validate,
)
from tenants.forms import CreditsField
from tenants.models import Campaign


def service_checked(check: Callable[[Any], Any], value: Any) -> None:
    """Run a service's validation on what a form cleaned; its refusal becomes a form error."""
    try:
        check(value)
    except MarketError as exc:
        raise forms.ValidationError(str(exc)) from exc


def limit_field_name(tier: Tier) -> str:
    return f"limit_{tier.slug}"


class BidForm(forms.Form):
    quantity = forms.IntegerField(min_value=1, label="GPUs wanted", initial=1)
    min_quantity = forms.IntegerField(
        min_value=0,
        initial=0,
        label="Gang minimum",
        help_text="All or nothing below this many GPUs; 0 = any number up to the quantity is useful.",
    )
    campaign = forms.ModelChoiceField(
        queryset=Campaign.objects.none(), required=False, empty_label="No campaign"
    )

    def __init__(self, *args, tiers, campaigns=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tiers = list(tiers)
        for tier in self.tiers:
            self.fields[limit_field_name(tier)] = CreditsField(
                required=False,
                label=f"Limit on {tier.name} ({tier.slug})",
                help_text="Most you will pay, credits per GPU-hour; leave empty if this tier will not do.",
            )
        if campaigns is None:
            del self.fields["campaign"]
        else:
            self.fields["campaign"].queryset = campaigns

    def limit_fields(self):
        return [self[limit_field_name(t)] for t in self.tiers]

    def clean(self):
        cleaned = super().clean()
        if not any(cleaned.get(limit_field_name(t)) for t in self.tiers) and not any(
            limit_field_name(t) in self.errors for t in self.tiers
        ):
            raise forms.ValidationError(
                "Give a limit price for at least one tier: the most you would pay per GPU-hour there."
            )
        return cleaned

    def limits(self) -> dict[str, int]:
        """{tier slug: milli-credits per GPU-hour} for the tiers given a limit."""
        return {
            t.slug: self.cleaned_data[limit_field_name(t)]
            for t in self.tiers
            if self.cleaned_data.get(limit_field_name(t))
        }


class TierForm(forms.ModelForm):
    """A tier's settable fields, on the staff tiers page and in the admin. The services check
    them (``clean`` asks the same validation the service runs, so a refusal shows on the form);
    the views and the admin save through ``tier_create`` / ``tier_update``, never ``save()``."""

    name = forms.CharField(max_length=120)
    gpu_model = forms.CharField(max_length=120, required=False, label="GPU model")
    capacity = forms.IntegerField(
        min_value=0, help_text="Healthy GPUs (telemetry keeps this current for registered nodes)."
    )
    maintenance_gpus = forms.IntegerField(min_value=0, label="GPUs in maintenance")
    preemptible = forms.BooleanField(required=False)
    active = forms.BooleanField(required=False, label="Offered in rounds")
    energy_price = CreditsField(
        allow_zero=True,
        required=False,
        label="Energy price (credits per kWh)",
        help_text="Charged after each window for the energy its GPUs used; empty or 0: none.",
    )
    power_cap_w = forms.IntegerField(
        min_value=POWER_CAP_MIN_W,
        max_value=POWER_CAP_MAX_W,
        required=False,
        label="Power cap (W per GPU)",
        help_text="The agents set it as each GPU's power limit; empty: no cap.",
    )

    class Meta:
        model = Tier
        fields = TIER_FIELDS

    def clean_energy_price(self) -> int:
        return self.cleaned_data.get("energy_price") or 0

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        service_checked(tier_changes_validate, {n: data[n] for n in TIER_FIELDS if n in data})
        return data

    def validate_unique(self) -> None:
        # The services check uniqueness, with their own message.
        return


class TierCreateForm(TierForm):
    slug = forms.SlugField(
        max_length=40, help_text="Lower-case letters, digits and hyphens, e.g. a100."
    )
    field_order = ["slug", "name", "gpu_model", "capacity", "maintenance_gpus", "preemptible"]

    class Meta(TierForm.Meta):
        fields = ("slug", *TIER_FIELDS)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["active"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        service_checked(tier_slug_validate, data.get("slug", ""))
        return data


def value_field_name(tier: Tier) -> str:
    return f"value_{tier.slug}"


# The services name the field a refusal is about first ("ceiling: ..."); the edges show it
# next to the field the person typed, which for the restart is in minutes, not seconds.
_SERVICE_FIELDS = {"restart_seconds": "restart_minutes", "gpu_hours": "gpu_hours"}
_ORDER_FIELDS = (
    "name",
    "values",
    "gpus",
    "min_gpus",
    "gpu_hours",
    "ceiling",
    "deadline",
    "restart_seconds",
    "campaign",
    "command",
    "slurm_job",
)


def order_error_field(message: str) -> str | None:
    """The edge's field a service refusal of an order names first, or None."""
    head = message.split(":", 1)[0].split(" ", 1)[0].strip()
    if head not in _ORDER_FIELDS:
        return None
    return _SERVICE_FIELDS.get(head, head)


class OrderForm(forms.Form):
    """A standing order as typed: values in credits per GPU-hour, GPU-hours as hours, the
    ceiling in credits, the restart in minutes; ``terms()`` hands the services their units."""

    name = forms.CharField(max_length=120, help_text="e.g. the run it drives")
    gpus = forms.IntegerField(
        min_value=1, initial=1, label="GPUs", help_text="Asked for each round."
    )
    min_gpus = forms.IntegerField(
        min_value=1,
        required=False,
        label="Minimum GPUs (gang)",
        help_text="All or nothing below this many; empty = all of them (a rigid gang), 1 = any number helps.",
    )
    gpu_hours = forms.DecimalField(
        min_value=Decimal("0.001"),
        max_digits=12,
        decimal_places=3,
        required=False,
        label="GPU-hours wanted",
        help_text="Empty = until cancelled.",
    )
    ceiling = CreditsField(
        label="Spend ceiling (credits)", help_text="The most it may spend in all."
    )
    deadline = forms.DateTimeField(
        required=False,
        label="Deadline (UTC)",
        help_text="Optional: it stops bidding then. e.g. 2030-01-09 18:00",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    restart_minutes = forms.IntegerField(
        min_value=0,
        max_value=24 * 60,
        initial=5,
        label="Restart minutes",
        help_text="Work lost each time it is stopped or moved (back to its last checkpoint).",
    )
    campaign = forms.ModelChoiceField(
        queryset=Campaign.objects.none(), required=False, empty_label="No campaign"
    )
    command = forms.CharField(
        max_length=1000,
        required=False,
        help_text="What `gpumarket run --order` starts on its GPUs, e.g. python train.py",
    )
    slurm_job = forms.CharField(
        max_length=64, required=False, label="Slurm job", help_text="Or the Slurm job it drives."
    )
    preemptible = forms.BooleanField(
        required=False,
        label="Backfill",
        help_text="Also take GPUs left unsold or reclaimed within a window, on preemptible "
        "terms (the work is suspended when the window ends).",
    )

    def __init__(self, *args, tiers, campaigns=None, editing: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tiers = list(tiers)
        for tier in self.tiers:
            self.fields[value_field_name(tier)] = CreditsField(
                required=False,
                label=f"Value on {tier.name} ({tier.slug})",
                help_text="Most it pays, credits per GPU-hour; empty = this tier will not do.",
            )
        if campaigns is None or editing:
            del self.fields["campaign"]
        else:
            self.fields["campaign"].queryset = campaigns
        if editing:
            # Campaign, command and Slurm job are set when the order is made.
            for name in ("command", "slurm_job", "preemptible"):
                del self.fields[name]

    def value_fields(self):
        return [self[value_field_name(t)] for t in self.tiers]

    def clean(self):
        cleaned = super().clean()
        if not any(cleaned.get(value_field_name(t)) for t in self.tiers) and not any(
            value_field_name(t) in self.errors for t in self.tiers
        ):
            raise forms.ValidationError(
                "Give a value for at least one tier: the most the order pays per GPU-hour there."
            )
        gpus, min_gpus = cleaned.get("gpus"), cleaned.get("min_gpus")
        if gpus and min_gpus and min_gpus > gpus:
            self.add_error("min_gpus", f"At most the GPUs asked for ({gpus}).")
        deadline = cleaned.get("deadline")
        if deadline is not None and deadline.tzinfo is None:
            cleaned["deadline"] = deadline.replace(tzinfo=UTC)
        return cleaned

    def values(self) -> dict[str, int]:
        """{tier slug: milli-credits per GPU-hour} for the tiers given a value."""
        return {
            t.slug: self.cleaned_data[value_field_name(t)]
            for t in self.tiers
            if self.cleaned_data.get(value_field_name(t))
        }

    def terms(self) -> dict[str, Any]:
        """The services' arguments (milli-credits, GPU-seconds, seconds)."""
        data = self.cleaned_data
        hours = data.get("gpu_hours")
        terms = {
            "name": data["name"],
            "values": self.values(),
            "gpus": data["gpus"],
            "min_gpus": data.get("min_gpus"),
            "gpu_seconds_wanted": None if hours is None else int(hours * SECONDS_PER_HOUR),
            "ceiling": data["ceiling"],
            "deadline": data.get("deadline"),
            "restart_seconds": data["restart_minutes"] * 60,
        }
        for name in ("campaign", "command", "slurm_job"):
            if name in self.fields:
                terms[name] = data.get(name) or ("" if name != "campaign" else None)
        if "preemptible" in self.fields:
            terms["preemptible"] = bool(data.get("preemptible"))
        return terms

    def service_error(self, message: str) -> None:
        """A service's refusal, next to the field it names (or above the form)."""
        field = order_error_field(message)
        if field == "values" and self.tiers:
            field = None
        self.add_error(field if field in self.fields else None, message)
