"""Approval pages: the queue (staff decide, auditors read), the request forms (staff), and a
team's requests with its credits form (managers).

Each view parses and authorises, calls one service or selector, and renders; a refusal from a
service becomes a message or a form error, never a 500.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from core.auth import staff_or_auditor_required, staff_required
from core.errors import DomainError
from governance.forms import REQUEST_FORMS, DecisionForm, TeamCreditsForm
from governance.models import ChangeRequest
from governance.rules import rules
from governance.selectors import requests_decided, requests_of_team, requests_pending
from governance.services import change_approve, change_reject, change_request, change_withdraw
from tenants.access import manager_tenant_of

Kind = ChangeRequest.Kind
Status = ChangeRequest.Status
PAGE_SIZE = 50


@require_http_methods(["GET"])
@staff_or_auditor_required
def approvals_queue(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    if status and status not in Status.values:
        status = ""
    pending = requests_pending()
    page = Paginator(requests_decided(status=status), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "governance/queue.html",
        {
            "pending": pending,
            "page": page,
            "status": status,
            "query": f"status={status}" if status else "",
            "statuses": Status.choices,
            "rules": list(rules().values()),
            "kinds": [(kind, Kind(kind).label) for kind in REQUEST_FORMS],
            "decision_form": DecisionForm(),
            "may_decide": request.user.is_staff,
        },
    )


@require_http_methods(["GET", "POST"])
@staff_required
def approval_new(request: HttpRequest, kind: str) -> HttpResponse:
    form_class = REQUEST_FORMS.get(kind)
    if form_class is None:
        raise Http404(f"No kind of change {kind!r}.")
    if request.method == "GET":
        # A staff page that met the rule sends the person here with what they typed.
        form = form_class(initial=request.GET.dict())
        return render(request, "governance/new.html", {"form": form, "kind": Kind(kind)})
    form = form_class(request.POST)
    if form.is_valid():
        try:
            req = change_request(
                kind=kind,
                actor=request.user,
                justification=form.cleaned_data["justification"],
                payload=form.payload(),
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Change request #{req.pk} sent: {req.summary}. Another administrator must "
                "approve it before it applies.",
            )
            return redirect("approvals_queue")
    return render(request, "governance/new.html", {"form": form, "kind": Kind(kind)}, status=400)


def _note(request: HttpRequest) -> str:
    form = DecisionForm(request.POST)
    return form.cleaned_data["note"] if form.is_valid() else ""


def _decided(request: HttpRequest, req: ChangeRequest, done: str) -> HttpResponse:
    messages.success(request, f"Change request #{req.pk} {done}: {req.summary}.")
    return redirect("approvals_queue")


def _refused(request: HttpRequest, exc: DomainError) -> HttpResponse:
    messages.error(request, str(exc))
    return redirect("approvals_queue")


@require_POST
@staff_required
def approval_approve(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        req = change_approve(pk=pk, actor=request.user, note=_note(request))
    except DomainError as exc:
        return _refused(request, exc)
    return _decided(request, req, "approved and applied")


@require_POST
@staff_required
def approval_reject(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        req = change_reject(pk=pk, actor=request.user, note=_note(request))
    except DomainError as exc:
        return _refused(request, exc)
    return _decided(request, req, "rejected")


@require_POST
@login_required
def approval_withdraw(request: HttpRequest, pk: int) -> HttpResponse:
    """The requester takes a waiting request back: an admin from the queue, a manager from the
    team's requests page (each is sent back where they came from)."""
    back = "approvals_queue" if request.user.is_staff else "team_requests"
    try:
        req = change_withdraw(pk=pk, actor=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect(back)
    messages.success(request, f"Change request #{req.pk} withdrawn: {req.summary}.")
    return redirect(back)


def _team_page(request, tenant, *, form=None, status=200) -> HttpResponse:
    page = Paginator(requests_of_team(tenant=tenant), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "governance/team.html",
        {"tenant": tenant, "page": page, "form": form or TeamCreditsForm(tenant=tenant)},
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def team_requests(request: HttpRequest) -> HttpResponse:
    tenant = manager_tenant_of(request.user)
    if tenant is None:
        raise PermissionDenied("Only a team's managers ask for credits and see its requests.")
    if request.method == "GET":
        return _team_page(request, tenant)
    form = TeamCreditsForm(request.POST, tenant=tenant)
    if form.is_valid():
        try:
            req = change_request(
                kind=Kind.TEAM_CREDITS,
                actor=request.user,
                justification=form.cleaned_data["justification"],
                payload=form.payload(),
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request, f"Request #{req.pk} sent: {req.summary}. A platform admin decides it."
            )
            return redirect("team_requests")
    return _team_page(request, tenant, form=form, status=400)
