"""Display helpers for templates: money is stored in milli-credits and shown in credits; the
CSP nonce on our figures' inline scripts."""

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.utils.text import slugify

from tenants.ledger import credits as credits_format

register = template.Library()


@register.filter
def credits(value: object) -> str:
    """12345 milli-credits -> '12.345'; empty for a missing value."""
    if value is None or value == "":
        return ""
    return credits_format(int(value))


@register.filter
def pct_width(value: object) -> str:
    """A percentage clamped to 0..100 for a CSS bar width."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "0"
    return f"{min(max(number, 0.0), 100.0):.1f}"


_SCRIPT_TAG = re.compile(r"<script(?=[\s>])")


@register.filter
def with_nonce(html: str, nonce: object) -> str:
    """A figure's HTML (made by our own chart code, never user input) with the request's CSP
    nonce on each of its inline scripts, so the Content-Security-Policy lets them run."""
    tagged = _SCRIPT_TAG.sub(f'<script nonce="{escape(str(nonce))}"', str(html))
    return mark_safe(tagged)  # noqa: S308 - our own figure HTML, the nonce escaped


@register.filter
def get_item(mapping: object, key: object) -> object:
    """``mapping[key]`` in a template; 0 for a missing key (a team absent from one side of a
    comparison spent nothing there)."""
    if not isinstance(mapping, dict):
        return 0
    return mapping.get(key, 0)


@register.filter
def charge_shown(allocation: object) -> str:
    """An allocation's charge net of what came back: a voided round's revoked allocation
    costs nothing (its charge was refunded), a cap refund is taken off."""
    charge = int(getattr(allocation, "charge", 0))
    if getattr(allocation, "status", "") == "revoked":
        back = charge
    else:
        back = int(getattr(allocation, "cap_refund", 0) or 0)
    net = credits_format(charge - back)
    if not back:
        return net
    return mark_safe(  # noqa: S308 - two formatted numbers
        f'{net} <span class="muted">({credits_format(back)} refunded)</span>'
    )


@register.filter
def tier_label(tier: object) -> str:
    """A tier's name, with its slug beside it (muted) only when the slug says something the
    name does not ("A100 80GB a100", but "Preemptible", not "Preemptible preemptible")."""
    name, slug = str(getattr(tier, "name", "")), str(getattr(tier, "slug", ""))
    if not slug or slugify(name) == slug:
        return escape(name)
    return mark_safe(f'{escape(name)} <span class="muted">{escape(slug)}</span>')  # noqa: S308


@register.filter
def gpus(n: object) -> str:
    """'1 GPU', '3 GPUs'."""
    return f"{n} GPU" if str(n) == "1" else f"{n} GPUs"
