"""The efficiency pages' filters: a period in days and, on a team's page, one campaign."""

from __future__ import annotations

from django import forms

from tenants.models import Campaign, Tenant

MAX_DAYS = 90
DEFAULT_DAYS = 14


class EfficiencyFilterForm(forms.Form):
    days = forms.IntegerField(
        min_value=1, max_value=MAX_DAYS, required=False, label="Days", initial=DEFAULT_DAYS
    )

    def period(self) -> int:
        return self.cleaned_data.get("days") or DEFAULT_DAYS


class TeamEfficiencyFilterForm(EfficiencyFilterForm):
    campaign = forms.ModelChoiceField(
        queryset=Campaign.objects.none(), required=False, empty_label="all work"
    )

    def __init__(self, *args, tenant: Tenant, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Only the caller's team's campaigns: another team's id is "not one of the choices".
        field = self.fields["campaign"]
        field.queryset = Campaign.objects.filter(tenant=tenant).order_by("-starts_at")
        field.label_from_instance = lambda campaign: campaign.name
