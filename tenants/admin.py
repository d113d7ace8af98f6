"""Django admin for tenants and the ledger. Balances are never edited here: a credit grant
goes through the ledger service with a reason, like every other movement of credits."""

from axes.admin import AccessAttemptAdmin, AccessFailureLogAdmin, AccessLogAdmin
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse

from core.errors import DomainError
from tenants.approvals import NEEDS_APPROVAL, approval_form_url, approval_needed
from tenants.forms import GrantForm
from tenants.ledger import credits, credits_grant
from tenants.models import (
    Account,
    Budget,
    Campaign,
    Entry,
    LedgerOperation,
    Membership,
    Notification,
    Tenant,
    Transfer,
)
from tenants.services import tenant_create
from tenants.services.signin import signin_unlock


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipInline(admin.TabularInline):
    """Shown, not edited: members are created, re-roled and removed on the team's page, where
    the services check them and audit every change."""

    model = Membership
    extra = 0
    fields = readonly_fields = ("user", "role", "created_at")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    """A tenant is created here through the service (accounts, audit event); once created it
    is read-only here: grants have their own page, weights and members their pages."""

    list_display = ("name", "slug", "weight", "available", "escrow")
    search_fields = ("name", "slug")
    inlines = [MembershipInline]
    readonly_fields = ("created_at",)

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def available(self, obj):
        return credits(obj.accounts.get(kind=Account.Kind.AVAILABLE).balance)

    def escrow(self, obj):
        return credits(obj.accounts.get(kind=Account.Kind.ESCROW).balance)

    def get_urls(self):
        return [
            path(
                "<int:pk>/grant/",
                self.admin_site.admin_view(self.grant_view),
                name="tenants_tenant_grant",
            ),
            *super().get_urls(),
        ]

    def save_model(self, request, obj, form, change):
        # Only additions reach here (changes are refused above). A new tenant needs its
        # accounts and an audit event: create it through the service.
        created = tenant_create(name=obj.name, slug=obj.slug, weight=obj.weight, actor=request.user)
        obj.pk = created.pk
        obj.created_at = created.created_at

    def save_formset(self, request, form, formset, change):
        # The membership inline is read-only; nothing to save.
        return None

    def grant_view(self, request, pk):
        tenant = get_object_or_404(Tenant, pk=pk)
        form = GrantForm(request.POST or None, tenant=tenant)
        if request.method == "POST" and form.is_valid():
            if approval_needed("credit_grant", amount=form.cleaned_data["amount"]):
                messages.info(request, NEEDS_APPROVAL)
                return redirect(
                    approval_form_url(
                        "credit_grant",
                        tenant=tenant.pk,
                        amount=request.POST.get("amount"),
                        reason=form.cleaned_data["reason"],
                    )
                )
            try:
                credits_grant(
                    tenant=tenant,
                    amount=form.cleaned_data["amount"],
                    reason=form.cleaned_data["reason"],
                    actor=request.user,
                )
            except DomainError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(
                    request, f"Granted {credits(form.cleaned_data['amount'])} credits to {tenant}."
                )
                return redirect(reverse("admin:tenants_tenant_change", args=[pk]))
        return render(
            request,
            "admin/tenants/grant.html",
            {
                **self.admin_site.each_context(request),
                "form": form,
                "tenant": tenant,
                "title": f"Grant credits to {tenant}",
            },
        )


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "tenant", "kind", "balance")
    list_filter = ("kind",)


class EntryInline(admin.TabularInline):
    model = Entry
    extra = 0
    can_delete = False
    readonly_fields = ("account", "amount")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Transfer)
class TransferAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "tenant", "amount", "reference", "reason", "actor")
    list_filter = ("kind",)
    search_fields = ("reference", "reason", "tenant__name")
    inlines = [EntryInline]


@admin.register(LedgerOperation)
class LedgerOperationAdmin(ReadOnlyAdmin):
    list_display = ("key", "outcome", "message", "created_at")


@admin.register(Campaign)
class CampaignAdmin(ReadOnlyAdmin):
    """Managers create campaigns on the team's page (the service audits them)."""

    list_display = ("name", "tenant", "starts_at", "ends_at")


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdmin):
    """Caps are set on the team's and the staff budget pages, through the service that
    audits them and re-checks enforcement; here they are only shown."""

    list_display = ("tenant", "window", "campaign", "mode", "cap", "active")
    list_filter = ("window", "mode", "active")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tenant", "level", "kind", "message")
    list_filter = ("level", "kind")


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class AuditedUserAdmin(UserAdmin):
    """Django's user admin; every change of is_staff, is_superuser or is_active it saves is
    an audit event naming the administrator (audit/receivers.py records it)."""

    def save_model(self, request, obj, form, change):
        obj._audit_actor = request.user
        super().save_model(request, obj, form, change)


# django-axes' own admin, registered here (AXES_ENABLE_ADMIN is off) to add the unlock action.
admin.site.register(AccessLog, AccessLogAdmin)
admin.site.register(AccessFailureLog, AccessFailureLogAdmin)


@admin.register(AccessAttempt)
class UnlockingAccessAttemptAdmin(AccessAttemptAdmin):
    """Failed sign-ins. "Unlock" lifts the locks on the selected attempts' addresses."""

    actions = [*AccessAttemptAdmin.actions, "unlock"]

    @admin.action(
        description="Unlock the addresses of the selected attempts", permissions=["delete"]
    )
    def unlock(self, request, queryset):
        addresses = set(queryset.values_list("ip_address", flat=True))
        removed = signin_unlock(ip_addresses=addresses, actor=request.user)
        self.message_user(
            request, f"Unlocked {len(addresses)} address(es); {removed} attempt record(s) removed."
        )
