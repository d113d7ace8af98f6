"""Django admin for tenants and the ledger. Balances are never edited here: a credit grant
goes through the ledger service with a reason, like every other movement of credits."""

from django.contrib import admin, messages
from django.shortcuts import redirect, render
from django.urls import path, reverse

from tenants.errors import TenantError
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
from tenants.services import member_add, tenant_create


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role")
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "weight", "available", "escrow")
    search_fields = ("name", "slug")
    inlines = [MembershipInline]
    readonly_fields = ("created_at",)

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
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new tenant needs its accounts and an audit event: create it through the service.
        created = tenant_create(name=obj.name, slug=obj.slug, weight=obj.weight, actor=request.user)
        obj.pk = created.pk
        obj.created_at = created.created_at

    def save_formset(self, request, form, formset, change):
        # Memberships are written by the service so each change is audited.
        for inline_form in formset.forms:
            if not inline_form.has_changed() or not inline_form.is_valid():
                continue
            data = inline_form.cleaned_data
            if data.get("DELETE"):
                raise TenantError("remove members from the tenant's members page")
            member_add(
                tenant=form.instance,
                username=data["user"].get_username(),
                role=data["role"],
                actor=request.user,
            )

    def grant_view(self, request, pk):
        tenant = Tenant.objects.get(pk=pk)
        form = GrantForm(request.POST or None, tenant=tenant)
        if request.method == "POST" and form.is_valid():
            try:
                credits_grant(
                    tenant=tenant,
                    amount=form.cleaned_data["amount"],
                    reason=form.cleaned_data["reason"],
                    actor=request.user,
                )
            except TenantError as exc:
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
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "starts_at", "ends_at")


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ("tenant", "window", "campaign", "mode", "cap", "active")
    list_filter = ("window", "mode", "active")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tenant", "level", "kind", "message")
    list_filter = ("level", "kind")
