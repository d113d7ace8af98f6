"""Change-request forms, one per kind, each built on the staff form of the change it asks
for (the same fields and checks) plus a justification; ``payload()`` is what the service takes."""

from __future__ import annotations

from typing import Any

from django import forms

from governance.models import ChangeRequest
from market.models import PolicyVersion, Tier
from tenants.forms import CreditsField, GrantForm, StaffBudgetForm
from tenants.models import Campaign, Tenant
from tenants.services.tenants import MAX_WEIGHT

Kind = ChangeRequest.Kind


def _justification() -> forms.CharField:
    return forms.CharField(
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why the change is needed: the approver reads this, and the audit log keeps it.",
    )


class GrantRequestForm(GrantForm):
    justification = _justification()

    def payload(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {"tenant": d["tenant"].pk, "amount": d["amount"], "reason": d["reason"]}


class TeamCreditsForm(forms.Form):
    amount = CreditsField(label="Amount (credits)")
    reason = forms.CharField(
        max_length=200, help_text="What the credits are for (recorded with the grant)."
    )
    justification = _justification()

    def __init__(self, *args, tenant: Tenant, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenant = tenant

    def payload(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {"tenant": self.tenant.pk, "amount": d["amount"], "reason": d["reason"]}


class PolicyRequestForm(forms.Form):
    version = forms.ModelChoiceField(
        queryset=PolicyVersion.objects.filter(
            status__in=[PolicyVersion.Status.DRAFT, PolicyVersion.Status.SHADOW]
        ).order_by("-number"),
        to_field_name="number",
        label="Policy version",
    )
    justification = _justification()

    def payload(self) -> dict[str, Any]:
        return {"version": self.cleaned_data["version"].number}


class TierRequestForm(forms.Form):
    tier = forms.ModelChoiceField(queryset=Tier.objects.order_by("slug"))
    capacity = forms.IntegerField(min_value=0, help_text="Lower only: capacity is measured.")
    maintenance_gpus = forms.IntegerField(min_value=0, label="GPUs in maintenance")
    justification = _justification()

    def payload(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {
            "tier": d["tier"].pk,
            "capacity": d["capacity"],
            "maintenance_gpus": d["maintenance_gpus"],
        }


class BudgetRequestForm(StaffBudgetForm):
    justification = _justification()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, campaigns=Campaign.objects.select_related("tenant"), **kwargs)

    def payload(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {
            "tenant": d["tenant"].pk,
            "window": d["window"],
            "mode": d["mode"],
            "cap": d["cap"],
            "campaign": d["campaign"].pk if d.get("campaign") else None,
        }


class WeightRequestForm(forms.Form):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.all())
    weight = forms.IntegerField(
        min_value=0,
        max_value=MAX_WEIGHT,
        help_text="Entitlement used by the fairness floor and max-min (relative).",
    )
    justification = _justification()

    def payload(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {"tenant": d["tenant"].pk, "weight": d["weight"]}


# The staff request forms by kind (a team's credits have their own page).
REQUEST_FORMS: dict[str, type[forms.Form]] = {
    Kind.POLICY_ACTIVATE: PolicyRequestForm,
    Kind.CREDIT_GRANT: GrantRequestForm,
    Kind.TIER_CHANGE: TierRequestForm,
    Kind.BUDGET_RAISE: BudgetRequestForm,
    Kind.TENANT_WEIGHT: WeightRequestForm,
}


class DecisionForm(forms.Form):
    note = forms.CharField(
        max_length=500,
        required=False,
        label="Note",
        help_text="Recorded with the decision; a rejection needs one.",
    )
