"""The Alerts page: what each person gets by email, the team's webhooks (managers) and the
log of every delivery of the team's notices."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from alerts.forms import PreferenceForm, WebhookForm
from alerts.kinds import CATEGORIES
from alerts.selectors import deliveries_of, preference_of, webhooks_of
from alerts.services import preference_set, webhook_create, webhook_disable
from core.errors import DomainError
from tenants.access import membership_of


def _page(request: HttpRequest, *, pref_form=None, hook_form=None, secret=None, status=200):
    membership = membership_of(request.user)
    tenant = membership.tenant if membership else None
    if tenant is None and not request.user.is_staff:
        raise PermissionDenied("Alerts are for members of a team and for platform staff.")
    return render(
        request,
        "alerts/alerts.html",
        {
            "tenant": tenant,
            "is_manager": bool(membership and membership.is_manager),
            "categories": CATEGORIES,
            "pref_form": pref_form
            or PreferenceForm(initial={"email_categories": preference_of(request.user)}),
            "hook_form": hook_form or WebhookForm(),
            "webhooks": webhooks_of(tenant) if tenant else [],
            "deliveries": deliveries_of(tenant),
            "secret": secret,
        },
        status=status,
    )


@login_required
@require_http_methods(["GET", "POST"])
def alerts_page(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    form = PreferenceForm(request.POST)
    if form.is_valid():
        try:
            preference_set(
                user=request.user, email_categories=form.cleaned_data["email_categories"]
            )
        except DomainError as exc:
            form.add_error("email_categories", str(exc))
        else:
            messages.success(request, "Saved which alerts you get by email.")
            return redirect("alerts")
    return _page(request, pref_form=form, status=400)


def _manager_tenant(request: HttpRequest):
    membership = membership_of(request.user)
    if membership is None or not membership.is_manager:
        raise PermissionDenied("Only the team's managers can change its webhooks.")
    return membership.tenant


@login_required
@require_POST
def webhook_new(request: HttpRequest) -> HttpResponse:
    tenant = _manager_tenant(request)
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            hook, secret = webhook_create(
                tenant=tenant,
                actor=request.user,
                url=form.cleaned_data["url"],
                categories=form.cleaned_data["categories"],
            )
        except DomainError as exc:
            form.add_error("url" if str(exc).startswith("url:") else None, str(exc))
        else:
            messages.success(request, f"Added webhook {hook.pk} for {hook.url}.")
            return _page(request, secret=(hook, secret))
    return _page(request, hook_form=form, status=400)


@login_required
@require_POST
def webhook_disable_view(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = _manager_tenant(request)
    hook = webhook_disable(tenant=tenant, actor=request.user, webhook_id=pk)
    messages.success(request, f"Webhook {hook.pk} no longer receives alerts.")
    return redirect("alerts")
