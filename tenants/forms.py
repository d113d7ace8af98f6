"""Forms for the tenant pages: they parse what a person typed into the services' arguments.

Amounts are typed in credits (up to three decimals) and handed on as integer milli-credits;
the services validate everything else and their refusals come back as form errors.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django import forms
from django.core.exceptions import ValidationError

from tenants.ledger import MAX_AMOUNT, MILLI
from tenants.models import Budget, Campaign, Membership, Tenant
from tenants.services.tenants import MAX_WEIGHT

_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_DIGITS = re.compile(r"\d+(\.\d+)?")
# A number with an exponent of at most 7 digits: Decimal reads it without computing its digits.
_EXPONENT = re.compile(r"(\d+(\.\d*)?|\.\d+)e[+-]?\d{1,7}", re.IGNORECASE)


class CreditsField(forms.CharField):
    """Credits as typed ("12.5", "1,000") -> integer milli-credits, never a float."""

    default_error_messages = {
        "invalid": "Enter an amount in credits, e.g. 12 or 12.5 (at most three decimals).",
        "negative": "Enter an amount of zero or more.",
        "zero": "Enter an amount greater than zero.",
        "large": "Enter at most %(most)s credits.",
        "comma": "Use a point for decimals (12.5); a comma only groups thousands (1,000).",
        "exponent": "Write the amount out without an exponent, e.g. 0.5 rather than 5e-1.",
    }
    # Checked before any arithmetic: "1e5000" or 5,000 digits are refused, not computed.
    MAX_CHARS = 32

    def __init__(self, *, allow_zero: bool = False, **kwargs) -> None:
        self.allow_zero = allow_zero
        kwargs.setdefault("widget", forms.TextInput(attrs={"inputmode": "decimal"}))
        super().__init__(**kwargs)

    def to_python(self, value: object) -> int | None:
        text = super().to_python(value)
        if text in self.empty_values:
            return None
        text = str(text).strip()
        if len(text) > self.MAX_CHARS:
            # Only digits: a number, too large to be an amount (9 x 5,000 is not "decimals").
            if _DIGITS.fullmatch(text):
                raise self._too_large()
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        if "e" in text.lower():
            # 1e30 is a number, and too large; 5e-1 is one written the way nobody types money.
            if _EXPONENT.fullmatch(text) and Decimal(text) > Decimal(MAX_AMOUNT) / MILLI:
                raise self._too_large()
            code = "exponent" if _EXPONENT.fullmatch(text) else "invalid"
            raise ValidationError(self.error_messages[code], code=code)
        if "," in text:
            # A comma only groups thousands ("1,000.5"); "12,5" is a decimal comma, which
            # would silently read as 125: refused with what to type instead.
            if not _THOUSANDS.fullmatch(text):
                raise ValidationError(self.error_messages["comma"], code="comma")
            text = text.replace(",", "")
        try:
            amount = Decimal(text)
        except InvalidOperation as exc:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from exc
        if not amount.is_finite():
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        if amount * MILLI > MAX_AMOUNT:
            raise self._too_large()
        milli = amount * MILLI
        if milli != milli.to_integral_value():
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        if milli < 0:
            raise ValidationError(self.error_messages["negative"], code="negative")
        if milli == 0 and not self.allow_zero:
            raise ValidationError(self.error_messages["zero"], code="zero")
        return int(milli)

    def _too_large(self) -> ValidationError:
        return ValidationError(
            self.error_messages["large"], code="large", params={"most": f"{MAX_AMOUNT // MILLI:,}"}
        )

    def prepare_value(self, value: object) -> object:
        # An int here is milli-credits (an initial value); show it in credits.
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{Decimal(value) / MILLI:f}"
        return value


class MemberForm(forms.Form):
    """A new account for the team: the team page never attaches an existing one."""

    username = forms.CharField(
        max_length=150,
        help_text="A new account: English letters, digits and @ . + - _ only.",
    )
    role = forms.ChoiceField(choices=Membership.Role.choices)
    password1 = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        label="Initial password",
        strip=False,
        help_text="At least 8 characters, not a common or all-numeric password.",
    )
    password2 = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        label="Password again",
        strip=False,
    )

    def clean(self):
        data = super().clean()
        if data.get("password1") and data.get("password2") != data.get("password1"):
            self.add_error("password2", "The two passwords do not match; type them again.")
        return data


class RoleForm(forms.Form):
    username = forms.CharField(max_length=150, widget=forms.HiddenInput)
    role = forms.ChoiceField(choices=Membership.Role.choices)
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


class MemberRemoveForm(forms.Form):
    username = forms.CharField(max_length=150, widget=forms.HiddenInput)
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


class CampaignForm(forms.Form):
    name = forms.CharField(max_length=120)
    starts_at = forms.DateTimeField(
        label="Starts",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC",
    )
    ends_at = forms.DateTimeField(
        label="Ends", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), help_text="UTC"
    )


class BudgetForm(forms.Form):
    window = forms.ChoiceField(choices=Budget.Window.choices)
    mode = forms.ChoiceField(choices=Budget.Mode.choices)
    cap = CreditsField(allow_zero=True, label="Cap (credits)")
    campaign = forms.ModelChoiceField(
        queryset=Campaign.objects.none(),
        required=False,
        help_text="Only for the campaign window.",
    )

    def __init__(self, *args, campaigns, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["campaign"].queryset = campaigns


class StaffBudgetForm(BudgetForm):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.all())
    field_order = ["tenant", "window", "mode", "cap", "campaign"]


class GrantForm(forms.Form):
    """A credit grant, on the staff credits page and on a tenant's admin page (where the
    tenant is given, not chosen)."""

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.all())
    amount = CreditsField(label="Amount (credits)")
    reason = forms.CharField(max_length=300, help_text="Recorded in the ledger and the audit log.")

    def __init__(self, *args, tenant: Tenant | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenant = tenant
        if tenant is not None:
            del self.fields["tenant"]

    def clean(self):
        data = super().clean()
        if self.tenant is not None:
            data["tenant"] = self.tenant
        return data


class TenantForm(forms.Form):
    name = forms.CharField(max_length=120)
    weight = forms.IntegerField(
        min_value=0,
        max_value=MAX_WEIGHT,
        initial=1,
        help_text="Entitlement used by the fairness floor (relative).",
    )
