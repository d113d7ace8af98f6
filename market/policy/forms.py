"""Policy forms: parse what an admin typed into the arguments of the policy services.

Reserve prices and the spend limit are typed in credits (at most three decimals, so an edit
never rounds) and stored in milli-credits. The services validate the terms; their refusals
come back as form errors.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from market.errors import MarketError
from market.models import PolicyVersion, Tier
from market.policy.guardrails import guardrails_validate
from market.services.policy import MAX_ROUND_MINUTES
from market.services.round_clearing import RESERVED_QUOTAS_PARAM
from tenants.forms import CreditsField

MAX_RESERVE = 10**9


def reserve_field_name(tier: Tier) -> str:
    return f"reserve_{tier.slug}"


def share_field_name(tier: Tier) -> str:
    return f"share_{tier.slug}"


class PolicyVersionForm(forms.Form):
    """Every setting of a policy version; saving makes a new version based on ``base``."""

    mechanism = forms.ChoiceField(choices=PolicyVersion.Mechanism.choices)
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Mechanism parameters (JSON)",
        help_text=(
            'A JSON object: the mechanism\'s parameters, e.g. {"time_limit": 5}, and optional '
            'reserved quotas set aside before it runs: {"reserved_quotas": "by_weight"} or '
            '{"reserved_quotas": {"tenant-slug": {"tier-slug": GPUs}}}; empty for none.'
        ),
    )
    round_minutes = forms.IntegerField(
        min_value=1, max_value=MAX_ROUND_MINUTES, label="Round length (minutes)"
    )
    lead_minutes = forms.IntegerField(
        min_value=0,
        max_value=MAX_ROUND_MINUTES,
        label="Bidding closes this many minutes before the window",
    )
    price_max_multiple = forms.FloatField(
        required=False,
        min_value=1.0,
        max_value=1000.0,
        label="Price guardrail: at most N x the trailing median",
        help_text="Empty = no price guardrail.",
    )
    price_window_rounds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        label="Trailing median over the last K rounds",
        help_text="Default 24.",
    )
    utilisation_min = forms.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        label="Utilisation floor (0-1)",
        help_text="Share of the usable GPUs (the lesser of offered and asked for) that must be allocated.",
    )
    jain_min = forms.FloatField(
        required=False, min_value=0.0, max_value=1.0, label="Fairness floor (Jain's index, 0-1)"
    )
    spend_max_per_window = CreditsField(
        required=False, label="Platform spend limit per window (credits)"
    )
    spend_window_hours = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=24 * 366,
        label="Spend window (hours)",
        help_text="Default 24.",
    )
    void_on_breach = forms.BooleanField(
        required=False, label="Also void a round that breaches a guardrail (refund its charges)"
    )
    note = forms.CharField(required=False, max_length=300, label="What changed and why")

    guardrail_names = (
        "price_max_multiple",
        "price_window_rounds",
        "utilisation_min",
        "jain_min",
        "spend_max_per_window",
        "spend_window_hours",
        "void_on_breach",
    )

    def __init__(
        self, *args: Any, tiers: list[Tier], base: PolicyVersion | None, **kwargs: Any
    ) -> None:
        if base is not None and "initial" not in kwargs:
            kwargs["initial"] = self.initial_from(base, tiers)
        super().__init__(*args, **kwargs)
        self.tiers = list(tiers)
        for tier in self.tiers:
            self.fields[reserve_field_name(tier)] = CreditsField(
                required=False,
                allow_zero=True,
                label=f"Reserve price for {tier.name} (credits per GPU-hour)",
                help_text="No sale below this, e.g. 2.5. Empty = 0.",
            )
            self.fields[share_field_name(tier)] = forms.IntegerField(
                required=False,
                min_value=1,
                max_value=100,
                label=f"Max share of {tier.name} per tenant (%)",
                help_text="Empty = 100.",
            )

    @staticmethod
    def initial_from(base: PolicyVersion, tiers: list[Tier]) -> dict[str, Any]:
        initial: dict[str, Any] = {
            "mechanism": base.mechanism,
            "params": json.dumps(base.params, sort_keys=True) if base.params else "",
            "round_minutes": base.round_minutes,
            "lead_minutes": base.lead_minutes,
        }
        for name in PolicyVersionForm.guardrail_names:
            if name in (base.guardrails or {}):
                initial[name] = base.guardrails[name]
        for tier in tiers:
            if tier.slug in base.reserve_prices:
                initial[reserve_field_name(tier)] = base.reserve_prices[tier.slug]
            if tier.slug in base.max_share_pct:
                initial[share_field_name(tier)] = base.max_share_pct[tier.slug]
        return initial

    def reserve_fields(self) -> list[forms.BoundField]:
        return [self[reserve_field_name(t)] for t in self.tiers]

    def share_fields(self) -> list[forms.BoundField]:
        return [self[share_field_name(t)] for t in self.tiers]

    def guardrail_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.guardrail_names]

    def clean_params(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("params") or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"not valid JSON: {exc.msg} at character {exc.pos}"
            ) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError('parameters must be a JSON object, e.g. {"key": 1}')
        quotas = value.get(RESERVED_QUOTAS_PARAM)
        if quotas not in (None, "by_weight") and not (
            isinstance(quotas, dict)
            and all(
                isinstance(row, dict)
                and all(
                    isinstance(g, int) and not isinstance(g, bool) and 0 <= g <= 100_000
                    for g in row.values()
                )
                for row in quotas.values()
            )
        ):
            raise forms.ValidationError(
                f'{RESERVED_QUOTAS_PARAM}: use "by_weight" or {{"tenant-slug": {{"tier-slug": GPUs}}}} '
                "with whole numbers of GPUs from 0 to 100000"
            )
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for tier in getattr(self, "tiers", []):
            name = reserve_field_name(tier)
            if (data.get(name) or 0) > MAX_RESERVE:
                self.add_error(name, f"Enter at most {MAX_RESERVE // 1000:,} credits per GPU-hour.")
        raw = {name: data.get(name) for name in self.guardrail_names}
        raw["void_on_breach"] = bool(raw["void_on_breach"]) or None
        try:
            data["guardrails"] = guardrails_validate(
                {k: v for k, v in raw.items() if v is not None}
            )
        except MarketError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data

    def changes(self) -> dict[str, Any]:
        """The keyword arguments for ``policy_version_create`` (after ``is_valid``)."""
        data = self.cleaned_data
        reserves = {
            t.slug: data[reserve_field_name(t)]
            for t in self.tiers
            if data.get(reserve_field_name(t)) not in (None, 0)
        }
        shares = {
            t.slug: data[share_field_name(t)]
            for t in self.tiers
            if data.get(share_field_name(t)) not in (None, 100)
        }
        return {
            "mechanism": data["mechanism"],
            "params": data["params"],
            "reserve_prices": reserves,
            "max_share_pct": shares,
            "round_minutes": data["round_minutes"],
            "lead_minutes": data["lead_minutes"],
            "guardrails": data["guardrails"],
            "note": data.get("note") or "",
        }


class VoidForm(forms.Form):
    reason = forms.CharField(
        max_length=400,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Shown to every tenant in the round and kept in the audit log.",
    )
    confirm = forms.BooleanField(
        label="I understand every charge in this round is refunded and its allocations are revoked now."
    )


class ReplayForm(forms.Form):
    rounds = forms.IntegerField(
        min_value=1, max_value=500, initial=24, label="Replay the last N settled rounds"
    )
