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


def jain_counting_left_out(
    diagnostics: dict[str, Any], *, cleared_teams: int, left_out_teams: int
) -> dict[str, Any]:
    """The diagnostics' Jain's index with the teams the round left out entirely (every bid over
    a hard cap or unplaceable) counted at nothing: the solver saw only the teams it cleared,
    so alone it reads 1 where one of two teams got nothing. With n teams in the solver's index
    J and k teams at zero, the index is J n / (n + k). Returns the keys to update: ``jain``,
    the solver's own figure as ``jain_cleared`` and ``teams_left_out``; nothing if k is 0."""
    value = diagnostic(diagnostics, JAIN)
    if not left_out_teams or not isinstance(value, int | float):
        return {}
    n = int(diagnostics.get("jain_tenants", cleared_teams))
    return {
        JAIN: float(value) * n / (n + left_out_teams) if n else 0.0,
        "jain_cleared": float(value),
        "teams_left_out": left_out_teams,
    }


def _pct_by_tier(value: Any) -> str:
    if not isinstance(value, dict):
        return str(value)
    return ", ".join(f"{tier} {100 * float(v):.0f} %" for tier, v in sorted(value.items()))


def _number(value: Any, digits: int = 2) -> str:
    return f"{float(value):.{digits}f}" if isinstance(value, int | float) else str(value)


def _credits(value: Any) -> str:
    from tenants.ledger import credits

    return credits(int(value)) if isinstance(value, int | float) else str(value)


# (key, label, how to show the value): the order is the order on the page.
_ROWS = (
    ("mechanism", "Mechanism", str),
    ("status", "Solver status", str),
    ("bids", "Bids cleared", str),
    (UTILISATION, "Utilisation (GPUs allocated / offered)", _pct_by_tier),
    (JAIN, "Fairness, Jain's index (1 = equal)", _number),
    ("jain_cleared", "Jain's index among the teams cleared only", _number),
    ("teams_left_out", "Teams left out of the clearing entirely (counted at nothing)", str),
    ("min_share_ratio", "Worst team's value / its fair share", _number),
    ("guarantees_unmet", "Teams below their guarantee", str),
    ("envy_violations", "Pairs of teams where one prefers the other's GPUs", str),
    ("expected_revenue", "Revenue (credits)", _credits),
    ("welfare", "Total value of the awards (credits per hour, bids' limits)", _credits),
    ("rounding_loss", "Value lost rounding to whole GPUs (credits per hour)", _credits),
    ("left_out_by_hard_cap", "Bids left out over a hard cap", lambda v: str(len(v or {}))),
    ("left_out_by_placement", "Bids placement could not fit", lambda v: str(len(v or {}))),
    ("preemptions", "Preemptions", str),
    ("parts", "Cleared in parts", str),
    ("total_seconds", "Clearing time (s)", _number),
)
_SHOWN = {key for key, _, _ in _ROWS} | {
    "spend", "build_seconds", "solve_seconds", "rounding_seconds", "divisible", "partitioned",
    "part_prices", "part_bids", "part_seconds", "utilization", "jain_index", "arrays_seconds",
    "jain_tenants",
}  # fmt: skip


def diagnostics_rows(diagnostics: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A round's diagnostics as (label, value) rows a person reads, known figures first in a
    fixed order with their units; anything else as it is, after them."""
    diagnostics = diagnostics or {}
    rows = []
    for key, label, show in _ROWS:
        value = diagnostic(diagnostics, key) if key in (UTILISATION, JAIN) else diagnostics.get(key)
        if value is not None:
            rows.append((label, show(value)))
    rows += [
        (key, _number(v, 3) if isinstance(v, float) else str(v))
        for key, v in sorted(diagnostics.items())
        if key not in _SHOWN
    ]
    return rows


def _per_tier(value: Any, show: Any = str) -> str:
    if not isinstance(value, dict):
        return str(value)
    return ", ".join(f"{tier} {show(v)}" for tier, v in sorted(value.items()))


def shadow_rows(
    shadow: dict[str, Any] | None, *, team_names: dict[int, str]
) -> list[tuple[str, str]]:
    """A round's shadow outcome as (label, value) rows: money in credits, teams by name
    (``team_names``: {tenant id: name}; the stored result keys teams by id)."""
    if not shadow:
        return []
    rows = [("Policy", f"v{shadow.get('number')} ({shadow.get('mechanism')})")]
    if shadow.get("error"):
        return [*rows, ("Solver error", str(shadow["error"]))]
    by_team = shadow.get("gpus_by_tenant") or {}
    rows += [
        ("Prices (credits per GPU-hour)", _per_tier(shadow.get("prices"), _credits)),
        ("GPUs allocated", _per_tier(shadow.get("allocated"))),
        (
            "GPUs by team",
            ", ".join(
                f"{team_names.get(int(pk), f'team {pk}')} {gpus}"
                for pk, gpus in sorted(by_team.items(), key=lambda kv: -kv[1])
            )
            or "none",
        ),
        ("Winning teams", str(shadow.get("winners", 0))),
        ("Revenue (credits)", _credits(shadow.get("revenue", 0))),
    ]
    if shadow.get(UTILISATION) is not None:
        rows.append(("Utilisation", _pct_by_tier(shadow[UTILISATION])))
    if shadow.get("fairness") is not None:
        rows.append(("Fairness, Jain's index (1 = equal)", _number(shadow["fairness"])))
    return rows
