"""Standing order pages for researchers and managers: the team's orders, a new one, one
order's progress and foresight, and its edit, pause, resume and cancel.

As in market/views.py: parse, authorise, call one service, render. Orders are fetched
through the caller's tenant (another tenant's order is a 404); a service refusal becomes a
form error next to the field it names.
"""

from __future__ import annotations

from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.confirm import confirm_page, confirmed
from core.errors import DomainError
from core.money import SECONDS_PER_HOUR
from market.forms import OrderForm, value_field_name
from market.models import Order
from market.selectors import (
    campaigns_current,
    order_bids,
    order_foresight,
    order_get,
    orders_for_tenant,
    tiers_offered,
)
from market.services.orders.lifecycle import (
    order_cancel,
    order_create,
    order_edit,
    order_pause,
    order_resume,
)
from tenants.access import require_tenant


def _hours(gpu_seconds: int | None) -> Decimal | None:
    if gpu_seconds is None:
        return None
    return (Decimal(gpu_seconds) / SECONDS_PER_HOUR).quantize(Decimal("0.01"))


def _row(order: Order, *, now) -> dict:
    """What the list and detail pages show of an order, in hours and credits."""
    sight = order_foresight(order=order, now=now) if order.live else None
    return {
        "order": order,
        "hours": _hours(order.gpu_seconds),
        "hours_wanted": _hours(order.gpu_seconds_wanted),
        "sight": sight,
    }


@require_GET
@login_required
def order_list(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    now = timezone.now()
    rows = [_row(order, now=now) for order in orders_for_tenant(tenant=tenant)[:100]]
    return render(request, "market/order_list.html", {"rows": rows})


def _form_page(request, *, form, editing=None, status=200) -> HttpResponse:
    return render(
        request,
        "market/order_form.html",
        {"form": form, "editing": editing},
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def order_new(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    campaigns = campaigns_current(tenant=tenant)
    tiers = tiers_offered()
    if request.method == "GET":
        return _form_page(request, form=OrderForm(tiers=tiers, campaigns=campaigns))
    form = OrderForm(request.POST, tiers=tiers, campaigns=campaigns)
    if form.is_valid():
        try:
            order = order_create(user=request.user, tenant=tenant, **form.terms())
        except DomainError as exc:
            form.service_error(str(exc))
        else:
            messages.success(request, f"Order {order.pk} created; it bids from the open round on.")
            return redirect("order_detail", pk=order.pk)
    return _form_page(request, form=form, status=400)


@require_GET
@login_required
def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    order = order_get(tenant=tenant, order_id=pk)
    return render(
        request,
        "market/order_detail.html",
        {**_row(order, now=timezone.now()), "bids": order_bids(order=order)},
    )


@require_http_methods(["GET", "POST"])
@login_required
def order_change(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    order = order_get(tenant=tenant, order_id=pk)
    tiers = tiers_offered()
    if request.method == "GET":
        initial = {
            "name": order.name,
            "gpus": order.gpus,
            "min_gpus": order.min_gpus,
            "gpu_hours": _hours(order.gpu_seconds_wanted),
            "ceiling": f"{Decimal(order.ceiling) / 1000:f}",
            "deadline": order.deadline,
            "restart_minutes": order.restart_seconds // 60,
        }
        initial |= {
            value_field_name(limit.tier): f"{Decimal(limit.price) / 1000:f}"
            for limit in order.limits.all()
        }
        form = OrderForm(initial=initial, tiers=tiers, editing=True)
        return _form_page(request, form=form, editing=order)
    form = OrderForm(request.POST, tiers=tiers, editing=True)
    if form.is_valid():
        try:
            order_edit(user=request.user, tenant=tenant, order_id=order.pk, **form.terms())
        except DomainError as exc:
            form.service_error(str(exc))
        else:
            messages.success(request, f"Order {order.pk} changed; it bids on the new terms.")
            return redirect("order_detail", pk=order.pk)
    return _form_page(request, form=form, editing=order, status=400)


def _status_action(request: HttpRequest, pk: int, service, done: str) -> HttpResponse:
    tenant = require_tenant(request.user)
    try:
        order = service(user=request.user, tenant=tenant, order_id=pk)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Order {order.pk} {done}.")
    return redirect("order_detail", pk=pk)


@require_POST
@login_required
def order_pause_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _status_action(request, pk, order_pause, "paused: it makes no more bids")


@require_POST
@login_required
def order_resume_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _status_action(request, pk, order_resume, "resumed: it bids from the open round on")


@require_http_methods(["GET", "POST"])
@login_required
def order_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    if not confirmed(request):
        order = order_get(tenant=require_tenant(request.user), order_id=pk)
        return confirm_page(
            request,
            title=f"Cancel order {order.pk}",
            question=(
                f"Cancel order {order.pk} ({order.name})? It makes no more bids; work it won "
                "runs to the end of its window. A cancelled order cannot be resumed."
            ),
            action=reverse("order_cancel", args=[order.pk]),
            back=reverse("order_detail", args=[order.pk]),
        )
    return _status_action(request, pk, order_cancel, "cancelled")
