"""How the pages name an enforcement action.

The model's choice label for ``terminate`` says "preempt", but most stops are a window's
normal end; the label is stored in migrations, so the pages name the action here."""

from __future__ import annotations

from django import template

from telemetry.models import EnforcementAction

register = template.Library()

Action = EnforcementAction.Action
LABELS = {
    Action.PAUSE: "Pause",
    Action.RESUME: "Resume",
    Action.TERMINATE: "Stop",
    Action.SUSPEND: "Suspend (order lost the round)",
}
CHOICES = [(value, LABELS[value]) for value in Action.values]


@register.filter
def action_label(action: EnforcementAction) -> str:
    """ "Stop at window end" when the allocation's window had ended when it was issued."""
    if (
        action.action == Action.TERMINATE
        and action.allocation is not None
        and action.allocation.ends_at <= action.created_at
    ):
        return "Stop at window end"
    return LABELS.get(action.action, action.get_action_display())
