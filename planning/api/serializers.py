"""Planning representations. Money in a scenario is credits as a string ("2.5"), as it is
typed on the page and in ``gpumarket plan``; results keep the run's milli-credits."""

from __future__ import annotations

from rest_framework import serializers

from core.api import StrictCharField, StrictFloatField, StrictIntegerField, StrictRegexField
from planning.models import PlannedCampaign, Scenario
from planning.scenario import MAX_GPUS, MAX_WEEKS, OPTION_KINDS
from planning.services.campaigns import MAX_GPU_HOURS

SLUG = r"^[-a-z0-9_]{1,40}$"
CREDITS = r"^\d{1,10}(?:\.\d{1,3})?$"


class PlannedCampaignSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    tiers = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)

    class Meta:
        model = PlannedCampaign
        fields = [
            "id", "tenant", "name", "starts_at", "ends_at", "gpu_hours", "tiers", "priority",
            "created_at", "withdrawn_at",
        ]  # fmt: skip
        extra_kwargs = {"priority": {"help_text": "1 low, 2 normal, 3 high."}}


class PlannedCampaignCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=120, trim_whitespace=False)
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    gpu_hours = StrictIntegerField(min_value=1, max_value=MAX_GPU_HOURS)
    tiers = serializers.ListField(
        child=StrictRegexField(SLUG), min_length=1, max_length=20,
        help_text="Slugs of the tiers any of which would do.",
    )  # fmt: skip
    priority = StrictIntegerField(
        min_value=1, max_value=3, default=2, help_text="1 low, 2 normal, 3 high."
    )


class TargetsSerializer(serializers.Serializer):
    max_unmet_pct = StrictFloatField(min_value=0, max_value=100, required=False)
    max_wait_rounds = StrictFloatField(min_value=0, max_value=10_000, required=False)


class ChangeSerializer(serializers.Serializer):
    """A change to an existing ``tier`` (``add_gpus``, ``reserve``) or a ``new_tier``
    (``gpus``, ``reserve``, ``name``); a change that mixes the two is refused (409)."""

    tier = StrictRegexField(SLUG, required=False)
    add_gpus = StrictIntegerField(min_value=-MAX_GPUS, max_value=MAX_GPUS, required=False)
    reserve = StrictRegexField(CREDITS, required=False, help_text='Credits, e.g. "2.5".')
    new_tier = StrictRegexField(SLUG, required=False)
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    name = StrictCharField(max_length=120, required=False, trim_whitespace=False)


class OptionSerializer(serializers.Serializer):
    """Fields by kind: purchase (price, amortisation_months, power_kw), reserved (per_hour,
    term_months), on_demand (per_hour), spot (per_hour, interruption_rate); any: max_gpus.
    A field of another kind, or a missing price, is refused (409)."""

    tier = StrictRegexField(SLUG)
    kind = serializers.ChoiceField(choices=OPTION_KINDS)
    price = StrictRegexField(CREDITS, required=False, help_text="Credits per GPU.")
    amortisation_months = StrictIntegerField(min_value=1, max_value=120, required=False)
    power_kw = StrictFloatField(min_value=0, max_value=10, required=False)
    per_hour = StrictRegexField(CREDITS, required=False, help_text="Credits per GPU-hour.")
    term_months = StrictIntegerField(min_value=1, max_value=60, required=False)
    interruption_rate = StrictFloatField(min_value=0, max_value=0.95, required=False)
    max_gpus = StrictIntegerField(min_value=0, max_value=MAX_GPUS, required=False)


class ScenarioCreateSerializer(serializers.Serializer):
    """The scenario document (docs/planning.md)."""

    name = StrictCharField(max_length=120, trim_whitespace=False)
    horizon_weeks = StrictIntegerField(min_value=1, max_value=MAX_WEEKS, default=4)
    changes = ChangeSerializer(many=True, required=False, max_length=50)
    job_gpus = StrictIntegerField(min_value=1, max_value=1_000, default=1)
    targets = TargetsSerializer(required=False)
    kwh_price = StrictRegexField(CREDITS, required=False, help_text="Credits per kWh.")
    options = OptionSerializer(many=True, required=False, max_length=100)


class ScenarioSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(
        source="created_by.get_username", read_only=True, allow_null=True
    )
    results = serializers.JSONField(
        read_only=True, allow_null=True,
        help_text="Set when the run is done: per tier and week (prices in milli-credits per "
        "GPU-hour), spend per team, backtest, recommendation (docs/planning.md).",
    )  # fmt: skip
    inputs = serializers.JSONField(read_only=True)

    class Meta:
        model = Scenario
        fields = [
            "id", "name", "status", "progress_done", "progress_total", "inputs", "results",
            "error", "created_by", "created_at", "started_at", "finished_at",
        ]  # fmt: skip
