"""Tenant pages: the dashboard, team management (managers), credits and budgets (staff).

Views parse, authorise, call one service and render; a refusal from a service (any
``DomainError``) becomes a form error so the person sees what to fix next to what they typed.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.auth import staff_or_auditor_required
from core.confirm import confirm_page
from core.errors import DomainError
from tenants.access import membership_of, require_tenant
from tenants.approvals import NEEDS_APPROVAL, approval_form_url, approval_needed
from tenants.budgets import budget_set, budget_usage, campaign_create
from tenants.forms import (
    BudgetForm,
    CampaignForm,
    GrantForm,
    MemberForm,
    MemberRemoveForm,
    RoleForm,
    StaffBudgetForm,
    TenantForm,
)
from tenants.ledger import balance_get, credits, credits_grant
from tenants.models import Budget, Tenant
from tenants.selectors import (
    budget_in_force,
    budgets_active,
    budgets_active_all,
    campaigns_all,
    campaigns_of,
    campaigns_with_budgets,
    grants_recent,
    member_get,
    members_of,
    notifications_platform,
    notifications_unread,
    teams_blocked,
    teams_capped,
    tenants_all,
)
from tenants.services import (
    member_create,
    member_remove,
    member_role_set,
    notifications_read,
    tenant_create,
)


def _usages(budgets):
    now = timezone.now()
    return [budget_usage(budget=b, at=now) for b in budgets]


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    membership = membership_of(request.user)
    if membership is None:
        if request.user.is_staff:
            return render(
                request,
                "tenants/staff_overview.html",
                {
                    "notifications": notifications_platform(),
                    "capped": teams_capped(),
                    "blocked": teams_blocked(),
                },
            )
        return render(request, "tenants/no_tenant.html", status=403)
    tenant = membership.tenant
    return render(
        request,
        "tenants/dashboard.html",
        {
            "tenant": tenant,
            "balance": balance_get(tenant=tenant),
            "usages": _usages(budgets_active(tenant=tenant)),
            # Unread only: a notice that no longer holds (work resumed) is cleared.
            "notifications": notifications_unread(tenant=tenant),
        },
    )


@require_POST
@login_required
def notifications_mark_read(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    try:
        notifications_read(tenant=tenant)
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("dashboard")


# Managers ---------------------------------------------------------------------------------


def _require_manager(request: HttpRequest) -> Tenant:
    tenant = require_tenant(request.user)
    if not request.user.membership.is_manager:
        raise PermissionDenied("Only the team's managers can manage members, campaigns and caps.")
    return tenant


def _members_page(request, tenant, *, form=None, status=200):
    members = members_of(tenant=tenant)
    # No ids on the per-row forms: every row would repeat id_username.
    rows = [
        (m, RoleForm(initial={"username": m.user.username, "role": m.role}, auto_id=False))
        for m in members
    ]
    managers = sum(1 for m in members if m.is_manager)
    return render(
        request,
        "tenants/team_members.html",
        {"tenant": tenant, "rows": rows, "form": form or MemberForm(), "managers": managers},
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def team_members(request: HttpRequest) -> HttpResponse:
    tenant = _require_manager(request)
    if request.method == "GET":
        return _members_page(request, tenant)
    form = MemberForm(request.POST)
    if form.is_valid():
        try:
            member_create(
                tenant=tenant,
                username=form.cleaned_data["username"],
                role=form.cleaned_data["role"],
                password=form.cleaned_data["password1"],
                actor=request.user,
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Created the account {form.cleaned_data['username']} as a "
                f"{form.cleaned_data['role']} of {tenant.name}.",
            )
            return redirect("team_members")
    return _members_page(request, tenant, form=form, status=400)


def _confirm_page(request, tenant, *, question: str, action: str, fields: dict) -> HttpResponse:
    return confirm_page(
        request,
        title=f"Members of {tenant.name}",
        question=question,
        action=action,
        back=reverse("team_members"),
        fields=fields,
    )


@require_POST
@login_required
def team_member_role(request: HttpRequest) -> HttpResponse:
    tenant = _require_manager(request)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a role for the member.")
        return redirect("team_members")
    username, role = form.cleaned_data["username"], form.cleaned_data["role"]
    if not form.cleaned_data["confirm"]:
        current = member_get(tenant=tenant, username=username)
        if current is None:
            messages.error(request, f"{username} is not a member of {tenant.name}.")
            return redirect("team_members")
        return _confirm_page(
            request,
            tenant,
            question=f"Change {username} from {current.get_role_display().lower()} to {role}?",
            action=reverse("team_member_role"),
            fields={"username": username, "role": role},
        )
    try:
        member_role_set(tenant=tenant, username=username, role=role, actor=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{username} is now a {role}.")
    return redirect("team_members")


@require_POST
@login_required
def team_member_remove(request: HttpRequest) -> HttpResponse:
    tenant = _require_manager(request)
    form = MemberRemoveForm(request.POST)
    if not form.is_valid():
        return redirect("team_members")
    username = form.cleaned_data["username"]
    if not form.cleaned_data["confirm"]:
        return _confirm_page(
            request,
            tenant,
            question=(
                f"Remove {username} from {tenant.name}? The account is deactivated and can no "
                "longer sign in; its bids and spend stay on the team's record."
            ),
            action=reverse("team_member_remove"),
            fields={"username": username},
        )
    try:
        member_remove(tenant=tenant, username=username, actor=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{username} was removed from {tenant.name}.")
    return redirect("team_members")


def _campaigns_page(request, tenant, *, campaign_form=None, budget_form=None, status=200):
    campaigns = campaigns_with_budgets(tenant=tenant)
    return render(
        request,
        "tenants/team_campaigns.html",
        {
            "tenant": tenant,
            "campaigns": campaigns,
            "usages": _usages(budgets_active(tenant=tenant)),
            "campaign_form": campaign_form or CampaignForm(),
            "budget_form": budget_form or BudgetForm(campaigns=campaigns_of(tenant=tenant)),
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def team_campaigns(request: HttpRequest) -> HttpResponse:
    tenant = _require_manager(request)
    if request.method == "GET":
        return _campaigns_page(request, tenant)
    form = CampaignForm(request.POST)
    if form.is_valid():
        try:
            campaign = campaign_create(tenant=tenant, actor=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Campaign {campaign.name} created.")
            return redirect("team_campaigns")
    return _campaigns_page(request, tenant, campaign_form=form, status=400)


def _budget_set_from(form, *, tenant: Tenant, actor) -> Budget:
    data = form.cleaned_data
    return budget_set(
        tenant=tenant,
        window=data["window"],
        mode=data["mode"],
        cap=data["cap"],
        campaign=data.get("campaign"),
        actor=actor,
    )


@require_POST
@login_required
def team_budget_set(request: HttpRequest) -> HttpResponse:
    tenant = _require_manager(request)
    form = BudgetForm(request.POST, campaigns=campaigns_of(tenant=tenant))
    if form.is_valid():
        try:
            budget = _budget_set_from(form, tenant=tenant, actor=request.user)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request, f"Budget set: {budget.get_window_display()} cap {credits(budget.cap)}."
            )
            return redirect("team_campaigns")
    return _campaigns_page(request, tenant, budget_form=form, status=400)


# Platform staff -----------------------------------------------------------------------------


def _tenants_page(request, *, form=None, status=200):
    return render(
        request,
        "tenants/staff_tenants.html",
        {"tenants": tenants_all(), "form": form or TenantForm()},
        status=status,
    )


@require_http_methods(["GET", "POST"])
@staff_or_auditor_required
def staff_tenants(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _tenants_page(request)
    form = TenantForm(request.POST)
    if form.is_valid():
        try:
            tenant = tenant_create(actor=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Tenant {tenant.name} created.")
            return redirect("staff_tenants")
    return _tenants_page(request, form=form, status=400)


def _credits_page(request, *, form=None, status=200):
    return render(
        request,
        "tenants/staff_credits.html",
        {
            "grants": grants_recent(),
            "form": form or GrantForm(initial={"tenant": request.GET.get("tenant")}),
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@staff_or_auditor_required
def staff_credits(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _credits_page(request)
    form = GrantForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        if approval_needed("credit_grant", amount=data["amount"]):
            messages.info(request, NEEDS_APPROVAL)
            return redirect(
                approval_form_url(
                    "credit_grant",
                    tenant=data["tenant"].pk,
                    amount=request.POST.get("amount"),
                    reason=data["reason"],
                )
            )
        try:
            credits_grant(
                tenant=data["tenant"],
                amount=data["amount"],
                reason=data["reason"],
                actor=request.user,
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request, f"Granted {credits(data['amount'])} credits to {data['tenant'].name}."
            )
            return redirect("staff_credits")
    return _credits_page(request, form=form, status=400)


def _budgets_page(request, *, form=None, status=200):
    return render(
        request,
        "tenants/staff_budgets.html",
        {
            "usages": _usages(budgets_active_all()),
            "form": form or StaffBudgetForm(campaigns=campaigns_all()),
        },
        status=status,
    )


def _budget_raise(data: dict) -> int:
    """How far a staff budget form raises the cap in force (0 for a new budget or a cut)."""
    current = budget_in_force(
        tenant=data["tenant"], window=data["window"], campaign=data.get("campaign")
    )
    return max(0, data["cap"] - current.cap) if current is not None else 0


@require_http_methods(["GET", "POST"])
@staff_or_auditor_required
def staff_budgets(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _budgets_page(request)
    form = StaffBudgetForm(request.POST, campaigns=campaigns_all())
    if form.is_valid():
        data = form.cleaned_data
        if approval_needed("budget_raise", raise_by=_budget_raise(data)):
            messages.info(request, NEEDS_APPROVAL)
            return redirect(
                approval_form_url(
                    "budget_raise",
                    tenant=data["tenant"].pk,
                    window=data["window"],
                    mode=data["mode"],
                    cap=request.POST.get("cap"),
                    campaign=data["campaign"].pk if data.get("campaign") else None,
                )
            )
        try:
            budget = _budget_set_from(form, tenant=form.cleaned_data["tenant"], actor=request.user)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Budget set for {budget.tenant.name}: {budget.get_window_display()} cap {credits(budget.cap)}.",
            )
            return redirect("staff_budgets")
    return _budgets_page(request, form=form, status=400)
