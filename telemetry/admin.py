"""Django admin for the fleet. Writes go through the services so each change is audited:
registering a node shows its token once, maintenance and revocation refresh tier capacity,
and enforcement actions are read-only (the loop and the agents write them)."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from telemetry import services
from telemetry.errors import TelemetryError
from telemetry.models import EnforcementAction, Gpu, Node


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "tier",
        "backend",
        "healthy",
        "last_seen_at",
        "revoked_at",
        "agent_version",
    )
    list_filter = ("healthy", "tier", "simulated")
    search_fields = ("name", "hostname")
    actions = ["revoke_tokens"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "tier")
        return super().get_fields(request, obj)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        # A registered node changes only through its agent's reports and the actions here.
        return [f.name for f in Node._meta.fields if f.name != "token_hash"]

    def get_exclude(self, request, obj=None):
        return ("token_hash",)

    def has_delete_permission(self, request, obj=None):
        return False  # nodes stay for the audit trail; revoke the token instead

    def save_model(self, request, obj, form, change):
        if change:
            return
        try:
            node, token = services.node_register(name=obj.name, tier=obj.tier, actor=request.user)
        except TelemetryError as exc:
            raise ValidationError(str(exc)) from exc
        obj.pk = node.pk
        obj.token_prefix, obj.token_hash, obj.created_at = (
            node.token_prefix,
            node.token_hash,
            node.created_at,
        )
        obj._state.adding = False
        messages.warning(
            request,
            f"Token for node {node.name} (shown only now; give it to the agent as "
            f"GPUMARKET_NODE_TOKEN): {token}",
        )

    @admin.action(description="Revoke the token of the selected nodes")
    def revoke_tokens(self, request, queryset):
        for node in queryset.order_by("pk"):
            services.node_token_revoke(node=node, actor=request.user)
        messages.success(request, f"Revoked {queryset.count()} node token(s).")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = (
        "uuid",
        "node",
        "index",
        "name",
        "tier",
        "memory_total_mib",
        "healthy",
        "maintenance",
        "last_seen_at",
    )
    list_filter = ("tier", "healthy", "maintenance", "node")
    search_fields = ("uuid", "node__name", "name")
    actions = ["maintenance_on", "maintenance_off"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Gpu._meta.fields]

    def has_add_permission(self, request):
        return False  # GPUs are discovered from their node's reports

    def has_delete_permission(self, request, obj=None):
        return False

    def _maintenance(self, request, queryset, value: bool) -> None:
        for gpu in queryset.order_by("pk"):
            services.gpu_maintenance_set(gpu=gpu, maintenance=value, actor=request.user)
        state = "in maintenance" if value else "back in service"
        messages.success(request, f"{queryset.count()} GPU(s) {state}; tier capacity updated.")

    @admin.action(description="Put in maintenance (out of the next rounds' capacity)")
    def maintenance_on(self, request, queryset):
        self._maintenance(request, queryset, True)

    @admin.action(description="Return from maintenance")
    def maintenance_off(self, request, queryset):
        self._maintenance(request, queryset, False)


@admin.register(EnforcementAction)
class EnforcementActionAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "created_at",
        "action",
        "state",
        "node",
        "gpu",
        "pid",
        "tenant",
        "allocation",
        "reason",
    )
    list_filter = ("action", "state", "node", "tenant")
    search_fields = ("reason", "detail", "node__name", "gpu__uuid")
    list_select_related = ("node", "gpu", "tenant", "allocation")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
