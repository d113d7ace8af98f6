"""Django admin for the market. Every write goes through market.services: a tier is created
or changed by the tier services, a policy change is saved as a NEW version (the version you
opened is never edited), and activation and shadowing are actions. Rounds, bids and
allocations are read-only here: they change only through the market's own flow."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect
from django.utils.html import format_html

from core.errors import DomainError
from market.errors import MarketError
from market.forms import TierCreateForm, TierForm
from market.models import Allocation, Bid, BidLimit, PolicyVersion, Round, Tier
from market.services.policy import policy_activate, policy_shadow_set
from market.services.tiers import TIER_FIELDS, tier_create, tier_update
from tenants.approvals import approval_needed


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _pretty(value) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, default=str))


# Tiers ------------------------------------------------------------------------------------


class _TierFormWithoutGpus(TierForm):
    """The tier form under the two-person rule: a tier's GPUs change through a request a
    second administrator approves (the Tiers page sends one), never here alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("capacity", "maintenance_gpus"):
            self.fields.pop(name, None)


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    """Tiers through the staff page's forms (market/forms.py) and the tier services."""

    form = TierForm
    list_display = (
        "slug",
        "name",
        "gpu_model",
        "capacity",
        "maintenance_gpus",
        "offered",
        "preemptible",
        "active",
    )
    list_filter = ("preemptible", "active")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ("created_at",)
        if approval_needed("tier_change"):  # shown, not editable: _TierFormWithoutGpus
            return ("slug", "created_at", "capacity", "maintenance_gpus")
        return ("slug", "created_at")

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = TierCreateForm
        elif approval_needed("tier_change"):
            kwargs["form"] = _TierFormWithoutGpus
        else:
            kwargs["form"] = TierForm
        return super().get_form(request, obj, **kwargs)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # A refusal of the tier services (a capacity raised by hand above what the nodes
        # report, say) is the person's to fix: said on the page, never a 500. The admin's
        # own transaction has rolled back by the time it arrives here.
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except DomainError as exc:
            self.message_user(request, str(exc), level=messages.ERROR)
            return HttpResponseRedirect(request.path)

    def get_fields(self, request, obj=None):
        # A new tier is offered from the start: TierCreateForm has no "active", so the add
        # page must not lay it out (it answered 500 on every visit).
        fields = super().get_fields(request, obj)
        return fields if obj is not None else [f for f in fields if f != "active"]

    def has_delete_permission(self, request, obj=None):
        # Tiers are referenced by bids and allocations; take one off offer with "active".
        return False

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            tier_update(
                tier=Tier.objects.get(pk=obj.pk),
                actor=request.user,
                **{name: data[name] for name in form.changed_data if name in TIER_FIELDS},
            )
            return
        created = tier_create(
            actor=request.user,
            slug=data["slug"],
            name=data["name"],
            gpu_model=data["gpu_model"],
            capacity=data["capacity"],
            maintenance_gpus=data["maintenance_gpus"],
            preemptible=data["preemptible"],
            energy_price=data.get("energy_price") or 0,
            power_cap_w=data.get("power_cap_w"),
        )
        if not data.get("active", True):
            tier_update(tier=created, actor=request.user, active=False)
        obj.pk, obj.created_at = created.pk, created.created_at


# Policy versions --------------------------------------------------------------------------


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = (
        "number",
        "mechanism",
        "status",
        "round_minutes",
        "lead_minutes",
        "parent",
        "created_by",
        "created_at",
        "activated_at",
    )
    list_filter = ("status", "mechanism")
    readonly_fields = ("number", "status", "parent", "created_by", "created_at", "activated_at")
    actions = ("activate", "shadow", "stop_shadow")

    def has_delete_permission(self, request, obj=None):
        return False

    # One staff surface per model: a version is created and edited on the policy pages
    # (market/policy/forms.py), never here; the admin lists versions and runs the actions.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return obj is None  # the list and its actions, not the change form

    def change_view(self, request, object_id, form_url="", extra_context=None):
        version = self.get_object(request, object_id)
        if version is None:
            return super().change_view(request, object_id, form_url, extra_context)
        return redirect("policy_edit", number=version.number)

    def add_view(self, request, form_url="", extra_context=None):
        return redirect("policy_new")

    def _act_on_one(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        service: Callable[..., PolicyVersion | None],
        done: str,
    ) -> None:
        """Run ``service(version=, actor=)`` on the one selected version; ``done`` follows
        "v<number> " in the success message."""
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one version.", messages.ERROR)
            return
        version = queryset.get()
        try:
            service(version=version, actor=request.user)
        except MarketError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"v{version.number} {done}")

    @admin.action(description="Activate the selected version (the active one is retired)")
    def activate(self, request, queryset):
        self._act_on_one(
            request, queryset, policy_activate, "is active from the next round opened."
        )

    @admin.action(description="Run the selected draft in shadow")
    def shadow(self, request, queryset):
        self._act_on_one(request, queryset, policy_shadow_set, "now clears every round in shadow.")

    @admin.action(description="Stop running any version in shadow")
    def stop_shadow(self, request, queryset):
        policy_shadow_set(version=None, actor=request.user)
        self.message_user(request, "No version runs in shadow now.")


# Rounds, bids, allocations (read-only) ------------------------------------------------------


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = readonly_fields = ("tenant", "bid", "tier", "gpus", "price", "charge", "status")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Round)
class RoundAdmin(ReadOnlyAdmin):
    list_display = (
        "pk",
        "status",
        "starts_at",
        "ends_at",
        "closes_at",
        "policy",
        "shadow_policy",
        "revenue",
    )
    list_filter = ("status",)
    inlines = [AllocationInline]
    fields = (
        "status",
        "policy",
        "shadow_policy",
        "opens_at",
        "closes_at",
        "starts_at",
        "ends_at",
        "revenue",
        "failure_reason",
        "cleared_at",
        "settled_at",
        "capacities_view",
        "prices_view",
        "diagnostics_view",
        "shadow_view",
    )
    readonly_fields = fields

    @admin.display(description="Capacities (GPUs)")
    def capacities_view(self, obj):
        return _pretty(obj.capacities)

    @admin.display(description="Prices (milli-credits per GPU-hour)")
    def prices_view(self, obj):
        return _pretty(obj.prices)

    @admin.display(description="Solver diagnostics")
    def diagnostics_view(self, obj):
        return _pretty(obj.diagnostics)

    @admin.display(description="Shadow policy outcome (not settled)")
    def shadow_view(self, obj):
        return _pretty(obj.shadow_result)


class BidLimitInline(admin.TabularInline):
    model = BidLimit
    extra = 0
    can_delete = False
    fields = readonly_fields = ("tier", "price")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Bid)
class BidAdmin(ReadOnlyAdmin):
    list_display = (
        "pk",
        "tenant",
        "author",
        "round",
        "quantity",
        "min_quantity",
        "escrow",
        "status",
        "created_at",
    )
    list_filter = ("status",)
    search_fields = ("tenant__name", "author__username")
    inlines = [BidLimitInline]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = (
        "pk",
        "tenant",
        "round",
        "tier",
        "gpus",
        "price",
        "charge",
        "starts_at",
        "ends_at",
        "status",
    )
    list_filter = ("status", "tier")
    search_fields = ("tenant__name",)
