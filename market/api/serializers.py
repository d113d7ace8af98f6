"""Market representations. Money is credits as a decimal string ("12.500"; prices per
GPU-hour), milli-credits inside: see tenants/api/money.py."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import MAX_ID, StrictCharField, StrictFloatField, StrictIntegerField
from core.money import SECONDS_PER_HOUR
from market.energy import kwh
from market.models import Allocation, Bid, Order, PolicyVersion, Round, Tier
from market.selectors import order_foresight
from market.services._common import MAX_GPUS, MAX_PRICE
from market.services.launch import ready_commands
from tenants.api.money import CreditsField, CreditsInputField, credits_text, positive_pattern
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
        placed = self.context.get("placed_limits")
        if placed is not None:
            return {slug: credits_text(placed[slug]) for slug in sorted(placed)}
        return {limit.tier.slug: credits_text(limit.price) for limit in bid.limits.all()}

    def to_representation(self, bid: Bid) -> dict:
        """What the fields above show, written out (a test holds the two equal): DRF builds
        a model serializer's fields anew for each object it shows, which took most of the
        CPU of answering with one bid."""
        shown_time = _SHOWN_TIME.to_representation
        return {
            "id": bid.pk,
            "round": bid.round_id,
            "status": bid.status,
            "quantity": bid.quantity,
            "min_quantity": bid.min_quantity,
            "limits": self.get_limits(bid),
            "escrow": credits_text(bid.escrow),
            "campaign": bid.campaign_id,
            "note": bid.note,
            "author": bid.author.get_username(),
            "outcome": bid.outcome,
            "outcome_reason": bid.outcome_reason,
            "created_at": shown_time(bid.created_at),
            "updated_at": shown_time(bid.updated_at),
        }


_SHOWN_TIME = serializers.DateTimeField(read_only=True)

_LIMITS_HELP = (
    '{tier slug: limit price in credits per GPU-hour, a string such as "2.5"}; a tier left out '
    "is not acceptable. "
    "Escrow held = quantity x highest limit x window hours."
)


class BidCreateSerializer(serializers.Serializer):
    round = StrictIntegerField(
        min_value=1, max_value=MAX_ID, help_text="The id of the round open for bids."
    )
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
    round = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)


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
    energy_kwh = serializers.SerializerMethodField(
        help_text="kWh its GPUs used in its window, metered after the window ends "
        "(a decimal string); null until then or when it was not placed on GPUs."
    )
    energy_charge = CreditsField(help_text="Credits charged for that energy at the tier's price.")

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
            "energy_kwh",
            "energy_charge",
        ]

    def get_ready_commands(self, allocation: Allocation) -> list[str]:
        return ready_commands(allocation)

    @extend_schema_field({"type": "string", "format": "decimal", "nullable": True})
    def get_energy_kwh(self, allocation: Allocation) -> str | None:
        return None if allocation.energy_j is None else str(kwh(allocation.energy_j))


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
    round = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)


# Standing orders ---------------------------------------------------------------------------

MOST_CEILING_CREDITS = 10**12  # the ledger's largest amount, in credits
MOST_GPU_HOURS = 10**8
MOST_RESTART_MINUTES = 24 * 60


@extend_schema_field(
    {
        "type": "string",
        "format": "decimal",
        "pattern": positive_pattern(MOST_CEILING_CREDITS),
        "example": "250",
        "description": "Credits, more than 0, with at most three decimals.",
    }
)
class CeilingInputField(CreditsInputField):
    """An order's spend ceiling, in credits."""

    most_credits = MOST_CEILING_CREDITS


class ForesightSerializer(serializers.Serializer):
    rounds = serializers.IntegerField(help_text="Recent rounds the estimate looks at.")
    win_rate = serializers.FloatField(
        allow_null=True,
        help_text="Share of those rounds the order's values would have won (null: none yet).",
    )
    windows_needed = serializers.IntegerField(
        allow_null=True, help_text="Windows it must still win (null: runs until cancelled)."
    )
    eta = serializers.DateTimeField(allow_null=True, help_text="When it should finish.")
    eta_reason = serializers.CharField(help_text="Why there is no ETA (empty when there is).")
    needed_value = CreditsField(
        allow_null=True,
        help_text="With a deadline: the lowest value, credits per GPU-hour, at which the recent "
        "rounds would have let it finish in time (null: see needed_reason).",
    )
    needed_reason = serializers.CharField()


class GpuHoursField(serializers.FloatField):
    """GPU-seconds inside, GPU-hours (a number) out."""

    def __init__(self, **kwargs) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: int) -> float:
        return round(int(value) / SECONDS_PER_HOUR, 6)


class OrderSerializer(serializers.ModelSerializer):
    values = serializers.SerializerMethodField(
        help_text="The most it pays per acceptable tier slug, credits per GPU-hour."
    )
    gpu_hours_wanted = GpuHoursField(
        source="gpu_seconds_wanted",
        allow_null=True,
        help_text="GPU-hours it wants in all; null: until cancelled.",
    )
    gpu_hours = GpuHoursField(source="gpu_seconds", help_text="GPU-hours received so far.")
    ceiling = CreditsField(help_text="The most it may spend in all, credits.")
    spent = CreditsField(help_text="Credits charged so far.")
    restart_minutes = serializers.SerializerMethodField(
        help_text="Work lost each time it is stopped or moved, minutes."
    )
    author = serializers.CharField(source="author.get_username", read_only=True)
    foresight = serializers.SerializerMethodField(help_text="From recent rounds' clearing prices.")

    class Meta:
        model = Order
        fields = [
            "id",
            "name",
            "status",
            "status_reason",
            "hold_reason",
            "values",
            "gpus",
            "min_gpus",
            "gpu_hours_wanted",
            "gpu_hours",
            "ceiling",
            "spent",
            "deadline",
            "restart_minutes",
            "campaign",
            "command",
            "slurm_job",
            "preemptible",
            "rounds_won",
            "rounds_lost",
            "preemptions",
            "author",
            "foresight",
            "created_at",
            "updated_at",
            "ended_at",
        ]
        extra_kwargs = {
            "status_reason": {"help_text": "Why it ended or was paused."},
            "hold_reason": {"help_text": "Why it made no bid in the latest round, if it did not."},
        }

    @extend_schema_field(serializers.DictField(child=CreditsField()))
    def get_values(self, order: Order) -> dict[str, str]:
        return {limit.tier.slug: credits_text(limit.price) for limit in order.limits.all()}

    def get_restart_minutes(self, order: Order) -> float:
        return round(order.restart_seconds / 60, 3)

    @extend_schema_field(ForesightSerializer())
    def get_foresight(self, order: Order) -> dict:
        return ForesightSerializer(order_foresight(order=order)).data


_VALUES_HELP = (
    '{tier slug: the most it pays, credits per GPU-hour, a string such as "2.5"}; a tier left '
    "out is not acceptable."
)


class OrderCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=120)
    values = serializers.DictField(
        child=PriceInputField(), allow_empty=False, help_text=_VALUES_HELP
    )
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, help_text="GPUs asked each round.")
    min_gpus = StrictIntegerField(
        min_value=1,
        max_value=MAX_GPUS,
        required=False,
        allow_null=True,
        default=None,
        help_text="All or nothing below this many GPUs (default: gpus, a rigid gang; 1 = any "
        "number helps).",
    )
    gpu_hours = StrictFloatField(
        min_value=0.001,
        max_value=MOST_GPU_HOURS,
        required=False,
        allow_null=True,
        default=None,
        help_text="GPU-hours wanted in all; null or left out: until cancelled.",
    )
    ceiling = CeilingInputField(help_text="The most it may spend in all, credits.")
    deadline = serializers.DateTimeField(
        required=False, allow_null=True, default=None, help_text="It stops bidding then."
    )
    restart_minutes = StrictIntegerField(
        min_value=0,
        max_value=MOST_RESTART_MINUTES,
        default=5,
        help_text="Work lost each time it is stopped or moved (from its last checkpoint).",
    )
    campaign = StrictIntegerField(
        min_value=1, allow_null=True, required=False, default=None, help_text="A campaign id."
    )
    command = StrictCharField(
        max_length=1000,
        required=False,
        allow_blank=True,
        default="",
        help_text="What `gpumarket run --order` starts on its GPUs.",
    )
    slurm_job = StrictCharField(
        max_length=64, required=False, allow_blank=True, default="", help_text="A Slurm job id."
    )
    preemptible = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Also take GPUs backfilled within a window, on preemptible terms.",
    )


class OrderEditSerializer(serializers.Serializer):
    name = StrictCharField(max_length=120, required=False)
    values = serializers.DictField(
        child=PriceInputField(), allow_empty=False, required=False, help_text=_VALUES_HELP
    )
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    min_gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    gpu_hours = StrictFloatField(
        min_value=0.001,
        max_value=MOST_GPU_HOURS,
        required=False,
        allow_null=True,
        help_text="null: until cancelled.",
    )
    ceiling = CeilingInputField(required=False)
    deadline = serializers.DateTimeField(required=False, allow_null=True, help_text="null: none.")
    restart_minutes = StrictIntegerField(
        min_value=0, max_value=MOST_RESTART_MINUTES, required=False
    )


class OrderFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Order.Status.choices, required=False)


class OrderAllocationQuerySerializer(serializers.Serializer):
    node = serializers.CharField(
        max_length=120, required=False, help_text="Only an allocation placed on this node."
    )
