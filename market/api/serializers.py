"""Market representations. Money is credits as a decimal string ("12.500"; prices per
GPU-hour), milli-credits inside: see tenants/api/money.py."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import StrictIntegerField
from market.models import Allocation, Bid, PolicyVersion, Round, Tier
from market.services._common import MAX_GPUS, MAX_PRICE
from market.services.launch import ready_commands
from tenants.api.money import CreditsField, CreditsInputField, positive_pattern
from tenants.ledger import MILLI

MOST_PRICE_CREDITS = MAX_PRICE // MILLI


@extend_schema_field(
    {
        "type": "string",
        "format": "decimal",
        "pattern": positive_pattern(MOST_PRICE_CREDITS),
        "example": "2.5",
        "description": f"Credits per GPU-hour, more than 0 and at most {MOST_PRICE_CREDITS:,}, "
        "with at most three decimals.",
    }
)
class PriceInputField(CreditsInputField):
    """A limit price per GPU-hour, in credits, up to the market's bound."""

    most_credits = MOST_PRICE_CREDITS


class TierSerializer(serializers.ModelSerializer):
    offered = serializers.IntegerField(read_only=True, help_text="Capacity less maintenance.")
    reserve_price = serializers.SerializerMethodField(
        help_text="Credits per GPU-hour under the active policy (0.000 if none)."
    )
    max_share_pct = serializers.SerializerMethodField(
        help_text="Most of this tier one tenant may win in a round, percent."
    )

    class Meta:
        model = Tier
        fields = [
            "slug",
            "name",
            "gpu_model",
            "capacity",
            "maintenance_gpus",
            "offered",
            "preemptible",
            "active",
            "reserve_price",
            "max_share_pct",
        ]

    def _policy(self) -> PolicyVersion | None:
        return self.context.get("policy")

    @extend_schema_field(CreditsField())
    def get_reserve_price(self, tier: Tier) -> str:
        policy = self._policy()
        return CreditsField().to_representation(policy.reserve_for(tier.slug) if policy else 0)

    def get_max_share_pct(self, tier: Tier) -> int:
        policy = self._policy()
        return policy.max_share_for(tier.slug) if policy else 100


class RoundSerializer(serializers.ModelSerializer):
    hours = serializers.FloatField(read_only=True, help_text="Length of the allocation window.")
    mechanism = serializers.CharField(source="policy.mechanism", read_only=True)
    policy_version = serializers.IntegerField(source="policy.number", read_only=True)
    capacities = serializers.DictField(
        child=serializers.IntegerField(), help_text="GPUs offered per tier slug (set at clearing)."
    )
    prices = serializers.DictField(
        child=CreditsField(),
        read_only=True,
        help_text="Clearing price per tier slug, credits per GPU-hour (set at clearing).",
    )

    class Meta:
        model = Round
        fields = [
            "id",
            "status",
            "opens_at",
            "closes_at",
            "starts_at",
            "ends_at",
            "hours",
            "mechanism",
            "policy_version",
            "capacities",
            "prices",
            "failure_reason",
            "cleared_at",
            "settled_at",
        ]


class RoundFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Round.Status.choices, required=False)
    since = serializers.DateTimeField(
        required=False, help_text="Rounds whose window starts at or after this."
    )
    until = serializers.DateTimeField(
        required=False, help_text="Rounds whose window starts before this."
    )


class BidSerializer(serializers.ModelSerializer):
    limits = serializers.SerializerMethodField(
        help_text="Limit price per acceptable tier slug, credits per GPU-hour."
    )
    escrow = CreditsField(help_text="Credits held for this bid now.")
    author = serializers.CharField(source="author.get_username", read_only=True)

    class Meta:
        model = Bid
        fields = [
            "id",
            "round",
            "status",
            "quantity",
            "min_quantity",
            "limits",
            "escrow",
            "campaign",
            "note",
            "author",
            "outcome",
            "outcome_reason",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {
            "outcome": {
                "help_text": "Set at settlement: won, hard_cap, below_reserve, outbid, gang, "
                "share_cap, fair_share or capacity (why it won less than it asked)."
            },
            "outcome_reason": {"help_text": "The same, as a sentence with the figures."},
        }

    @extend_schema_field(serializers.DictField(child=CreditsField()))
    def get_limits(self, bid: Bid) -> dict[str, str]:
        """The bid's limits, in tier slug order; for a bid just placed, ``placed_limits`` in the
        context ({tier slug: milli-credits}, what it was placed with) instead of a read."""
        shown = CreditsField()
        placed = self.context.get("placed_limits")
        if placed is not None:
            return {slug: shown.to_representation(placed[slug]) for slug in sorted(placed)}
        return {limit.tier.slug: shown.to_representation(limit.price) for limit in bid.limits.all()}


_LIMITS_HELP = (
    '{tier slug: limit price in credits per GPU-hour, a string such as "2.5"}; a tier left out '
    "is not acceptable. "
    "Escrow held = quantity x highest limit x window hours."
)


class BidCreateSerializer(serializers.Serializer):
    round = StrictIntegerField(min_value=1, help_text="The id of the round open for bids.")
    quantity = StrictIntegerField(min_value=1, max_value=MAX_GPUS, help_text="GPUs wanted.")
    min_quantity = StrictIntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        default=0,
        help_text="All or nothing below this many GPUs; 0 = any number up to quantity is useful.",
    )
    limits = serializers.DictField(
        child=PriceInputField(),
        allow_empty=False,
        help_text=_LIMITS_HELP,
    )
    campaign = StrictIntegerField(
        min_value=1,
        allow_null=True,
        required=False,
        default=None,
        help_text="One of your tenant's campaign ids, to count the spend against it.",
    )
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class BidEditSerializer(serializers.Serializer):
    quantity = StrictIntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    min_quantity = StrictIntegerField(min_value=0, max_value=MAX_GPUS, required=False)
    limits = serializers.DictField(
        child=PriceInputField(),
        allow_empty=False,
        required=False,
        help_text=_LIMITS_HELP,
    )


class BidFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Bid.Status.choices, required=False)
    round = serializers.IntegerField(min_value=1, required=False)


class PlacedGpuSerializer(serializers.Serializer):
    node = serializers.CharField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()


class AllocationSerializer(serializers.ModelSerializer):
    tier = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    price = CreditsField(help_text="Credits per GPU-hour: min(tier price, the bid's limit).")
    charge = CreditsField(help_text="Credits charged for the whole window.")
    cap_refund = CreditsField(
        help_text="Credits refunded because a hard spend cap paused the work before it ran."
    )
    placement = PlacedGpuSerializer(
        many=True,
        read_only=True,
        help_text="The GPUs placed for it at settlement; empty when no node reports its tier.",
    )
    ready_commands = serializers.SerializerMethodField(
        help_text="One `gpumarket run` per node it is placed on (replace the command)."
    )

    class Meta:
        model = Allocation
        fields = [
            "id",
            "round",
            "bid",
            "tier",
            "gpus",
            "price",
            "charge",
            "cap_refund",
            "starts_at",
            "ends_at",
            "status",
            "placement",
            "ready_commands",
        ]

    def get_ready_commands(self, allocation: Allocation) -> list[str]:
        return ready_commands(allocation)


class LaunchQuerySerializer(serializers.Serializer):
    node = serializers.CharField(
        max_length=120, help_text="The node the work starts on (its name on the fleet page)."
    )


class LaunchSerializer(serializers.Serializer):
    allocation = serializers.IntegerField()
    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPU indices.")
    uuids = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(
        child=serializers.CharField(),
        help_text="CUDA_VISIBLE_DEVICES, GPUMARKET_ALLOCATION and GPUMARKET_LAUNCH_TOKEN.",
    )


class AllocationFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Allocation.Status.choices, required=False)
    round = serializers.IntegerField(min_value=1, required=False)
