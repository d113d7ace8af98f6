"""The API tokens page: a user creates and revokes their own personal API tokens.

A new token's secret is rendered in the response to the POST that created it and nowhere
else: it is not put in the session or a message, and the response is marked no-store, so
reloading or going back cannot show it again.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from core.errors import DomainError
from tenants.services import MAX_ACTIVE_TOKENS, token_create, token_revoke, tokens_of


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=80,
        help_text="Where the token will be used, e.g. 'laptop' or 'training cluster job'.",
    )


def _page(
    request: HttpRequest, *, form: TokenCreateForm, secret: str = "", status: int = 200
) -> HttpResponse:
    response = render(
        request,
        "tenants/tokens.html",
        {
            "form": form,
            "tokens": tokens_of(user=request.user),
            "new_secret": secret,
            "max_active": MAX_ACTIVE_TOKENS,
            "api_base": request.build_absolute_uri("/api/v1/"),
        },
        status=status,
    )
    add_never_cache_headers(response)
    return response


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request, form=TokenCreateForm())
    form = TokenCreateForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    try:
        issued = token_create(user=request.user, name=form.cleaned_data["name"])
    except DomainError as exc:
        form.add_error("name", str(exc))
        return _page(request, form=form, status=400)
    return _page(request, form=TokenCreateForm(), secret=issued.secret)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = token_revoke(user=request.user, token_id=token_id)
    except DomainError as exc:
        raise Http404(str(exc)) from exc
    messages.success(
        request, f"Token “{token.name}” (gm_{token.prefix}…) is revoked; it no longer works."
    )
    return redirect("api_tokens")


urlpatterns = [
    path("", tokens, name="api_tokens"),
    path("<int:token_id>/revoke/", token_revoke_view, name="api_token_revoke"),
]
