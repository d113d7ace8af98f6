from django import template

from audit.display import shown

register = template.Library()


@register.filter
def in_credits(value):
    """An audit payload as indented JSON with amounts in credits."""
    return shown(value)
