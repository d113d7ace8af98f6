"""A second page that asks before a change that cannot be taken back (a role change, a bid
cancelled, a policy activated): the first POST shows the question, the confirmed one acts.
Works without JavaScript."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirm") == "1"


def confirm_page(
    request: HttpRequest,
    *,
    title: str,
    question: str,
    action: str,
    back: str,
    fields: dict[str, str] | None = None,
) -> HttpResponse:
    return render(
        request,
        "confirm.html",
        {"title": title, "question": question, "action": action, "back": back,
         "fields": fields or {}},
    )  # fmt: skip
