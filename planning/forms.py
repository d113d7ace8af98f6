"""Planning forms: a team's planned campaign; a staff scenario (its JSON document)."""

from __future__ import annotations

import json

from django import forms

from market.models import Tier
from planning.models import PlannedCampaign
from planning.scenario import ScenarioError, scenario_parse
from planning.services.campaigns import MAX_GPU_HOURS


class PlannedCampaignForm(forms.Form):
    name = forms.CharField(max_length=120)
    starts_at = forms.DateTimeField(
        label="Starts",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC",
    )
    ends_at = forms.DateTimeField(
        label="Ends", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), help_text="UTC"
    )
    gpu_hours = forms.IntegerField(
        label="GPU-hours",
        min_value=1,
        max_value=MAX_GPU_HOURS,
        help_text="All the GPU-hours the campaign needs, over its whole span.",
    )
    tiers = forms.ModelMultipleChoiceField(
        queryset=Tier.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        help_text="Any of these would do.",
    )
    priority = forms.TypedChoiceField(
        choices=PlannedCampaign.Priority.choices,
        coerce=int,
        initial=PlannedCampaign.Priority.NORMAL,
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tiers"].queryset = Tier.objects.filter(active=True).order_by("slug")

    def clean(self) -> dict:
        data = super().clean()
        starts, ends = data.get("starts_at"), data.get("ends_at")
        if starts and ends and ends <= starts:
            self.add_error("ends_at", "The campaign must end after it starts.")
        return data


class ScenarioForm(forms.Form):
    document = forms.CharField(
        label="Scenario (JSON)",
        widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false", "class": "mono"}),
        max_length=50_000,
        help_text="Tier changes, horizon, targets and the options to buy or rent; money in "
        'credits as strings ("2.5"). docs/planning.md describes every field.',
    )

    def clean_document(self) -> dict:
        text = self.cleaned_data["document"]
        try:
            document = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        try:
            scenario_parse(document)
        except ScenarioError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return document
