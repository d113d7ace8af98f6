"""Names of the clearing diagnostics the platform reads (stored in ``Round.diagnostics``)."""

from __future__ import annotations

from typing import Any

# The one spelling of the clearing diagnostics' utilisation and Jain's index outside the
# clearing package. Rounds stored before the names settled may carry the older spellings,
# which are read here and nowhere else.
UTILISATION = "utilisation"
JAIN = "jain"
_LEGACY = {UTILISATION: "utilization", JAIN: "jain_index"}


def diagnostic(diagnostics: dict[str, Any] | None, name: str) -> Any:
    """``diagnostics[name]`` (UTILISATION or JAIN), or None."""
    diagnostics = diagnostics or {}
    if name in diagnostics:
        return diagnostics[name]
    return diagnostics.get(_LEGACY[name])
