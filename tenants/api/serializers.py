"""Read-only representations of tenant data. Money is credits as a decimal string ("12.500"),
milli-credits inside: see tenants/api/money.py."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.api.money import CreditsField
from tenants.models import Account, Budget, Campaign, Notification, Transfer


class TenantRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    name = serializers.CharField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    tenant = TenantRefSerializer(allow_null=True)
    role = serializers.CharField(allow_null=True)
    token = serializers.CharField(
        allow_null=True, help_text="Name of the API token in use, if any."
    )


class BalanceSerializer(serializers.Serializer):
    available = CreditsField(help_text="Credits free to bid.")
    escrow = CreditsField(help_text="Credits held for open bids.")
    total = CreditsField(help_text="Available plus escrow.")


class TransferSerializer(serializers.ModelSerializer):
    amount = CreditsField(help_text="Credits moved.")
    available_change = serializers.SerializerMethodField(
        help_text="Signed effect on the tenant's available account, credits."
    )
    escrow_change = serializers.SerializerMethodField(
        help_text="Signed effect on the tenant's escrow account, credits."
    )
    source = serializers.CharField(source="source.kind")
    destination = serializers.CharField(source="destination.kind")

    class Meta:
        model = Transfer
        fields = [
            "id",
            "kind",
            "amount",
            "available_change",
            "escrow_change",
            "source",
            "destination",
            "campaign",
            "reference",
            "reason",
            "created_at",
        ]

    def _change(self, transfer: Transfer, kind: str) -> str:
        change = 0
        if transfer.source.kind == kind:
            change -= transfer.amount
        if transfer.destination.kind == kind:
            change += transfer.amount
        return CreditsField().to_representation(change)

    @extend_schema_field(CreditsField())
    def get_available_change(self, transfer: Transfer) -> str:
        return self._change(transfer, Account.Kind.AVAILABLE)

    @extend_schema_field(CreditsField())
    def get_escrow_change(self, transfer: Transfer) -> str:
        return self._change(transfer, Account.Kind.ESCROW)


class LedgerFilterSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Transfer.Kind.choices, required=False)
    reference = serializers.CharField(required=False, max_length=80)
    since = serializers.DateTimeField(
        required=False, help_text="Only transfers at or after this time."
    )
    until = serializers.DateTimeField(required=False, help_text="Only transfers before this time.")


class CampaignSerializer(serializers.ModelSerializer):
    class Meta:
        model = Campaign
        fields = ["id", "name", "starts_at", "ends_at", "created_at"]


class BudgetSerializer(serializers.ModelSerializer):
    campaign = CampaignSerializer(allow_null=True)
    window_start = serializers.DateTimeField(source="usage.window_start")
    window_end = serializers.DateTimeField(source="usage.window_end")
    cap = CreditsField(help_text="Most the team may be charged in the window, credits.")
    spent = CreditsField(source="usage.spent", help_text="Charges less refunds in the window.")
    held = CreditsField(source="usage.held", help_text="Escrow held now.")
    remaining = CreditsField(source="usage.remaining", help_text="Cap less spent and held.")

    class Meta:
        model = Budget
        fields = [
            "id",
            "window",
            "mode",
            "cap",
            "active",
            "campaign",
            "window_start",
            "window_end",
            "spent",
            "held",
            "remaining",
        ]


class NotificationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = ["id", "level", "kind", "message", "created_at", "read_at"]


class NotificationFilterSerializer(serializers.Serializer):
    unread = serializers.BooleanField(required=False, help_text="Only notifications not yet read.")
