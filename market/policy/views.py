"""Policy pages (platform staff only): versions, edit as a new version, activate, shadow,
the shadow comparison, replaying past rounds under a candidate, and voiding a round.

Each view parses and authorises, calls one service or selector, and renders.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.auth import staff_or_auditor_required, staff_required
from core.confirm import confirm_page, confirmed
from core.errors import DomainError
from market.models import PolicyVersion, Round
from market.policy import charts as policy_charts
from market.policy.forms import PolicyVersionForm, ReplayForm, VoidForm
from market.policy.guardrails import GUARDRAIL_FIELDS
from market.policy.replay import rounds_replay
from market.policy.selectors import (
    policy_alerts,
    round_allocations_to_revoke,
    shadow_comparison,
    version_get,
    versions_children,
    versions_list,
)
from market.selectors import policy_active_get, rounds_recent, tiers_all
from market.services.policy import (
    DEFAULT_ROUND_MINUTES,
    policy_activate,
    policy_active,
    policy_shadow_set,
    policy_version_create,
)
from market.services.void import round_void
from tenants.approvals import NEEDS_APPROVAL, approval_form_url, approval_needed
from tenants.ledger import credits


@staff_or_auditor_required
def policy_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "market/policy/list.html",
        {"versions": versions_list(), "alerts": policy_alerts(), "rounds": rounds_recent()},
    )


def _guardrail_label(name: str) -> str:
    """A guardrail named as the edit form names it, not by its stored key."""
    field = PolicyVersionForm.base_fields.get(name)
    return str(field.label) if field is not None and field.label else name


def _guardrail_value(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "spend_max_per_window" and isinstance(value, int):
        return f"{credits(value)} credits"
    return str(value)


@staff_or_auditor_required
def policy_detail(request: HttpRequest, number: int) -> HttpResponse:
    version = version_get(number=number)
    tiers = list(tiers_all())
    settings_rows = [(t, version.reserve_for(t.slug), version.max_share_for(t.slug)) for t in tiers]
    guardrails = [
        (_guardrail_label(name), _guardrail_value(name, version.guardrails[name]))
        for name in GUARDRAIL_FIELDS
        if name in version.guardrails
    ]
    return render(
        request,
        "market/policy/detail.html",
        {
            "version": version,
            "tier_rows": settings_rows,
            "guardrails": guardrails,
            "replay_form": ReplayForm(),
            "children": versions_children(version=version),
        },
    )


@staff_required
def policy_edit(request: HttpRequest, number: int | None = None) -> HttpResponse:
    """Edit = make a new draft version based on ``number`` (or the active version)."""
    if number is not None:
        base = version_get(number=number)
    elif request.method == "POST":
        try:
            base = policy_active()  # saving on a fresh platform makes the default v1 first
        except DomainError as exc:  # versions exist, none active: activating one comes first
            messages.error(request, str(exc))
            return redirect("policy_list")
    else:
        base = policy_active_get()  # a GET never writes; without a version, the defaults
    tiers = list(tiers_all())
    # Without any version the form starts from the default v1's settings (not saved).
    shown = base or PolicyVersion(
        mechanism=PolicyVersion.Mechanism.WELFARE, round_minutes=DEFAULT_ROUND_MINUTES
    )
    form = PolicyVersionForm(request.POST or None, tiers=tiers, base=shown)
    if request.method == "POST" and form.is_valid():
        try:
            version = policy_version_create(actor=request.user, based_on=base, **form.changes())
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Saved as v{version.number} (a draft based on v{base.number}). Run it in shadow or "
                "replay past rounds before activating it.",
            )
            return redirect("policy_detail", number=version.number)
    return render(request, "market/policy/edit.html", {"form": form, "base": base})


def _version_action(
    request: HttpRequest,
    number: int,
    service: Callable[..., PolicyVersion | None],
    done: str,
) -> HttpResponse:
    """Run ``service(version=, actor=)`` on version ``number``; ``done`` follows "v<number> "."""
    version = version_get(number=number)
    try:
        service(version=version, actor=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"v{version.number} {done}")
    return redirect("policy_detail", number=version.number)


@staff_required
@require_POST
def policy_activate_view(request: HttpRequest, number: int) -> HttpResponse:
    if approval_needed("policy_activate"):
        messages.info(request, NEEDS_APPROVAL)
        return redirect(
            approval_form_url("policy_activate", version=version_get(number=number).number)
        )
    if not confirmed(request):
        version = version_get(number=number)
        return confirm_page(
            request,
            title=f"Activate policy v{version.number}",
            question=(
                f"Activate v{version.number} ({version.get_mechanism_display()})? Every round "
                "opened from now on clears under it; the active version is retired."
            ),
            action=reverse("policy_activate", args=[version.number]),
            back=reverse("policy_detail", args=[version.number]),
        )
    return _version_action(
        request, number, policy_activate, "is active from the next round opened."
    )


@staff_required
@require_POST
def policy_shadow_view(request: HttpRequest, number: int) -> HttpResponse:
    return _version_action(request, number, policy_shadow_set, "now clears every round in shadow.")


@staff_required
@require_POST
def policy_shadow_clear(request: HttpRequest) -> HttpResponse:
    try:
        policy_shadow_set(version=None, actor=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, "Shadow mode stopped: rounds clear under the active version only."
        )
    return redirect("policy_list")


@staff_or_auditor_required
def shadow_compare(request: HttpRequest) -> HttpResponse:
    rows, totals = shadow_comparison(last=48)
    charts = (
        [policy_charts.comparison_html(rows, label="Shadow", element_id="shadow-chart")]
        if rows
        else []
    )
    return render(
        request,
        "market/policy/compare.html",
        {
            "rows": rows,
            "totals": totals,
            "charts": charts,
            "title": "Shadow comparison",
            "other_label": "Shadow",
        },
    )


@staff_required
def policy_replay(request: HttpRequest, number: int) -> HttpResponse:
    version = version_get(number=number)
    form = ReplayForm(request.GET or None)
    rows = totals = None
    charts: list[str] = []
    if form.is_valid():
        rows, totals = rounds_replay(version=version, last=form.cleaned_data["rounds"])
        if rows:
            charts = [
                policy_charts.comparison_html(
                    rows, label=f"v{version.number}", element_id="replay-chart"
                )
            ]
    return render(
        request,
        "market/policy/replay.html",
        {
            "version": version,
            "form": form,
            "rows": rows,
            "totals": totals,
            "charts": charts,
            "other_label": f"v{version.number} (replayed)",
            "other_label_names_policy": True,
        },
    )


@staff_required
def round_void_view(request: HttpRequest, pk: int) -> HttpResponse:
    rnd = get_object_or_404(Round.objects.select_related("policy"), pk=pk)
    if rnd.status == Round.Status.VOIDED:
        reason = rnd.failure_reason.removeprefix("voided: ")
        messages.info(request, f"Round {rnd.pk} was already voided: {reason}")
        return redirect("policy_list")
    form = VoidForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            round_void(round=rnd, actor=request.user, reason=form.cleaned_data["reason"])
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Round {rnd.pk} voided: charges refunded, allocations revoked; the enforcement loop "
                "stops the work with the normal grace period.",
            )
            return redirect("policy_list")
    allocations = round_allocations_to_revoke(rnd=rnd)
    return render(
        request, "market/policy/void.html", {"round": rnd, "form": form, "allocations": allocations}
    )
