"""The checks every table of settable fields starts with (policy versions, tiers, guardrails):
each names what may be set; anything else is refused, naming what was wrong and what is
allowed."""

from __future__ import annotations

from collections.abc import Iterable


def fields_unknown(given: Iterable[str], *, known: Iterable[str], message: str) -> str | None:
    """``message`` filled in with ``{unknown}`` and ``{known}`` (comma-separated names) when
    ``given`` names a field ``known`` does not; None when every name is known."""
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return None
    return message.format(unknown=", ".join(unknown), known=", ".join(known))
