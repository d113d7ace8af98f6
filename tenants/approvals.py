"""The two-person rule's door for the staff pages of tenants and the market.

Governance sits above both in the import order, so it registers its rule here when its app is
ready (as the market registers the staff overview's source in ``overview.py``). A staff page
asks ``approval_needed`` before changing something itself; when the answer is yes it sends the
person to the change-request form instead, and the change happens when a second admin approves.
"""

from __future__ import annotations

from collections.abc import Callable

Gate = Callable[..., bool]
_gate: Gate | None = None


def approval_gate_register(gate: Gate) -> None:
    """``gate(kind, **facts)`` -> whether a change of that kind and size needs a second admin."""
    global _gate
    _gate = gate


def approval_needed(kind: str, **facts: object) -> bool:
    """False when governance is not installed: the change is then made directly."""
    return _gate(kind, **facts) if _gate is not None else False


def approval_form_url(kind: str, **initial: object) -> str:
    """The change-request form for ``kind``, filled in with what the person typed."""
    from urllib.parse import urlencode

    from django.urls import reverse

    query = urlencode({k: v for k, v in initial.items() if v is not None and v != ""})
    return f"{reverse('approval_new', args=[kind])}?{query}"


NEEDS_APPROVAL = (
    "This change needs a second administrator's approval under the two-person rule: add a "
    "justification and send the request; it applies when another administrator approves it."
)
