"""Display helpers for templates: money is stored in milli-credits and shown in credits."""

from django import template

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
