"""The read-only roles' guard, in front of every view.

An auditor's request with a method that could write (anything but GET, HEAD, OPTIONS, TRACE)
is refused here, before any view runs, so a page or endpoint added later is covered without
knowing about auditors. Signing out and verifying the audit chain (a POST that writes nothing)
stay open. A request with an API token is authenticated by the API itself, which refuses an
auditor's token the same way (tenants/api/authentication.py), before any API view runs.

Every refused write (403 from here, from a view's own check, or from the API's permissions) by
an auditor or a team's manager is recorded in the audit log as ``access.denied``.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.defaults import permission_denied

import audit.services as audit
from core.auth import is_auditor
from tenants.access import membership_of

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Writes nothing in the application (the session is not the application's state).
OPEN_TO_AUDITORS = frozenset({"login", "logout", "audit_verify"})
AUDITOR_REFUSAL = "The auditor role reads; it changes nothing."
# Whose refused writes are recorded: the read-only role, and a team's manager reaching a
# platform administrator's path. A researcher's refusals (another team's row, a manager's
# page) are ordinary answers, and leave the log as it was.
AUDITED_ROLES = frozenset({"auditor", "manager"})


def _url_name(request: HttpRequest) -> str:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return ""
    return match.view_name or ""


def _caller(request: HttpRequest):
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def _role(user) -> str:
    if is_auditor(user):
        return "auditor"
    if user.is_staff:
        return "staff"
    membership = membership_of(user)
    return membership.role if membership is not None else "none"


def _refusal(request: HttpRequest) -> HttpResponse:
    if request.path_info.startswith("/api/"):
        body = {"error": {"code": "permission_denied", "message": AUDITOR_REFUSAL, "fields": {}}}
        return JsonResponse(body, status=403)
    return permission_denied(request, PermissionDenied(AUDITOR_REFUSAL))


def _record(request: HttpRequest, user, *, view: str) -> None:
    membership = membership_of(user)
    with transaction.atomic():
        audit.record(
            actor=user,
            action="access.denied",
            object_type="url",
            object_id=request.path_info[:64],
            tenant=membership.tenant if membership is not None else None,
            after={
                "method": request.method,
                "path": request.path_info[:300],
                "view": view,
                "role": _role(user),
            },
        )


class ReadOnlyRolesMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in SAFE_METHODS:
            return self.get_response(request)
        caller = _caller(request)
        if caller is not None and is_auditor(caller) and _url_name(request) not in OPEN_TO_AUDITORS:
            response = _refusal(request)
        else:
            response = self.get_response(request)
        if response.status_code == 403:
            # The view's name as Django resolved it for the view, or resolved here when no
            # view ran; every other request goes without a second resolution.
            match = getattr(request, "resolver_match", None)
            view = (match.view_name or "") if match is not None else _url_name(request)
            # An API view authenticates by itself; DRF puts its user on the request (or,
            # for an auditor's token it refused, on ``refused_user``).
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                user = caller or getattr(request, "refused_user", None)
            if user is not None and _role(user) in AUDITED_ROLES:
                _record(request, user, view=view)
        return response
