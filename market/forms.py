"""Bid and tier forms: parse what a person typed into the market services' arguments.

Limit prices are typed in credits per GPU-hour and handed on as milli-credits; the services
check the terms (quantities, tiers on offer, budgets, the round still open) and their refusals
come back as form errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from market.errors import MarketError
from market.models import Tier
from market.services.tiers import TIER_FIELDS, tier_changes_validate, tier_slug_validate
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

    class Meta:
        model = Tier
        fields = TIER_FIELDS

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
