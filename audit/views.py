"""Audit review: filter the log, verify the chain, export what is shown.

Staff and auditors see the whole log; a team's manager sees the team's events (``audit.access``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from audit.access import AuditScope, audit_scope
from audit.display import in_credits
from audit.models import AuditEvent
from audit.selectors import chain_verify, events_filter, tenants_in_scope

PAGE_SIZE = 50


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, help_text="Part of a username or system label.")
    tenant = forms.ModelChoiceField(queryset=AuditEvent.objects.none(), required=False)
    action = forms.CharField(required=False, help_text="e.g. ledger.grant, policy")
    object_type = forms.CharField(required=False, label="Object type", help_text="e.g. market.bid")
    object_id = forms.CharField(required=False, label="Object id")
    since = forms.DateField(
        required=False, label="From (UTC)", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        required=False,
        label="To (UTC, inclusive)",
        widget=forms.DateInput(attrs={"type": "date"}),
    )

    def __init__(self, *args, scope: AuditScope | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants_in_scope(scope=scope)

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and until < since:
            self.add_error("until", "The end date is before the start date.")
        return cleaned

    def filter_kwargs(self) -> dict:
        data = self.cleaned_data
        since, until = data.get("since"), data.get("until")
        return {
            "actor": data.get("actor", "").strip(),
            "tenant_id": data["tenant"].pk if data.get("tenant") else None,
            "action": data.get("action", "").strip(),
            "object_type": data.get("object_type", "").strip(),
            "object_id": data.get("object_id", "").strip(),
            "since": datetime.combine(since, time.min, tzinfo=UTC) if since else None,
            "until": datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC)
            if until
            else None,
        }


def _filtered(request: HttpRequest, scope: AuditScope) -> tuple[AuditFilterForm, object]:
    form = AuditFilterForm(request.GET or None, scope=scope)
    if request.GET and not form.is_valid():
        return form, AuditEvent.objects.none()
    kwargs = form.filter_kwargs() if request.GET else {}
    if scope.tenant_id is not None:
        # Whatever was asked, a manager reads the team's events only.
        kwargs["tenant_id"] = scope.tenant_id
    return form, events_filter(**kwargs)


@require_GET
@login_required
def audit_review(request: HttpRequest) -> HttpResponse:
    scope = audit_scope(request.user)
    form, events = _filtered(request, scope)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "audit/review.html",
        {"form": form, "page": page, "query": query.urlencode(), "scope": scope},
    )


@require_POST
@login_required
def audit_verify(request: HttpRequest) -> HttpResponse:
    if not audit_scope(request.user).may_verify:
        raise PermissionDenied("Verifying the whole chain is for administrators and auditors.")
    report = chain_verify()
    if report.ok:
        messages.success(request, report.describe())
    else:
        messages.error(request, report.describe())
    back = reverse("audit_review")
    query = request.POST.get("query", "")
    return redirect(f"{back}?{query}" if query else back)


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    # A cell starting with these is run as a formula by spreadsheet programs; the quote
    # keeps an actor label or a JSON payload from executing when the export is opened.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


class _Echo:
    def write(self, value: str) -> str:
        return value


CSV_HEADER = [
    "seq",
    "created_at",
    "actor",
    "tenant",
    "action",
    "object_type",
    "object_id",
    "before",
    "after",
    "hash",
]


def _payload(value: object) -> str:
    """A before/after payload as JSON with amounts in credits, as the review page shows it
    (the hash covers the stored milli-credits; "Verify chain" checks those)."""
    return json.dumps(in_credits(value), sort_keys=True) if value is not None else ""


def _csv_rows(events) -> Iterator[list[str]]:
    yield CSV_HEADER
    for e in events.iterator(chunk_size=1000):
        yield [
            _cell(e.seq),
            _cell(e.created_at.isoformat()),
            _cell(e.actor_label),
            _cell(e.tenant.slug if e.tenant_id else ""),
            _cell(e.action),
            _cell(e.object_type),
            _cell(e.object_id),
            _cell(_payload(e.before)),
            _cell(_payload(e.after)),
            _cell(e.hash),
        ]


@require_GET
@login_required
def audit_export(request: HttpRequest) -> HttpResponse:
    scope = audit_scope(request.user)
    form, events = _filtered(request, scope)
    if request.GET and not form.is_valid():
        return render(
            request,
            "audit/review.html",
            {
                "form": form,
                "page": Paginator(events, PAGE_SIZE).get_page(1),
                "query": "",
                "scope": scope,
            },
            status=400,
        )
    writer = csv.writer(_Echo())
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in _csv_rows(events)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
    return response
