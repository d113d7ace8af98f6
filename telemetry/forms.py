"""Forms of the telemetry pages."""

from __future__ import annotations

from django import forms

from telemetry.models import EnforcementAction, Node
from telemetry.templatetags.enforcement_display import CHOICES as ACTION_CHOICES
from tenants.models import Tenant


class EnforcementFilterForm(forms.Form):
    action = forms.ChoiceField(choices=[("", "any"), *ACTION_CHOICES], required=False)
    state = forms.ChoiceField(
        choices=[("", "any")] + EnforcementAction.State.choices, required=False
    )
    node = forms.ModelChoiceField(queryset=Node.objects.order_by("name"), required=False)
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"), required=False, empty_label="any"
    )
