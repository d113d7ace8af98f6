"""The check every table of settable fields starts with (policy versions, tiers, guardrails):
each names what may be set; anything else is refused, naming what was wrong and what is
allowed."""

from __future__ import annotations

from collections.abc import Iterable


def fields_known(
    given: Iterable[str], *, known: Iterable[str], message: str, error: type[Exception]
) -> None:
    """Raise ``error(message)``, filled in with ``{unknown}`` and ``{known}`` (comma-separated
    names), when ``given`` names a field ``known`` does not."""
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise error(message.format(unknown=", ".join(unknown), known=", ".join(known)))
