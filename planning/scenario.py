"""The scenario document: what a capacity what-if changes and what it may buy. Pure, no Django.

The same JSON is typed on the staff page, given to ``gpumarket plan FILE`` and posted to the
API, and it is kept as given with the results. Money is credits as a decimal string ("2.5"),
as everywhere a person types it; inside it is integer milli-credits.

    {"name": "8 more A100s",
     "horizon_weeks": 4,
     "changes": [{"tier": "a100", "add_gpus": 8},
                 {"tier": "h100", "reserve": "3"},
                 {"new_tier": "l40s", "gpus": 16, "reserve": "1"}],
     "job_gpus": 4,
     "targets": {"max_unmet_pct": 5, "max_wait_rounds": 2},
     "kwh_price": "0.2",
     "options": [{"tier": "a100", "kind": "purchase", "price": "30000",
                  "amortisation_months": 36, "power_kw": 0.4, "max_gpus": 32},
                 {"tier": "a100", "kind": "reserved", "per_hour": "2.2", "term_months": 12},
                 {"tier": "a100", "kind": "on_demand", "per_hour": "4"},
                 {"tier": "a100", "kind": "spot", "per_hour": "1.5", "interruption_rate": 0.3}]}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

MILLI = 1000
MAX_WEEKS = 26
MAX_GPUS = 100_000
MAX_CREDITS = 10**9
OPTION_KINDS = ("purchase", "reserved", "on_demand", "spot")
_CREDITS = re.compile(r"^\d{1,10}(?:\.\d{1,3})?$")
_SLUG = re.compile(r"^[-a-z0-9_]{1,40}$")


class ScenarioError(ValueError):
    """The document is malformed; the message names the field and what to write."""


@dataclass(frozen=True)
class TierChange:
    """``add_gpus`` may be negative (GPUs retired). ``reserve`` in milli-credits per GPU-hour,
    None to keep the policy's. ``new`` marks a tier that does not exist yet."""

    tier: str
    add_gpus: int = 0
    reserve: int | None = None
    new: bool = False
    name: str = ""


@dataclass(frozen=True)
class Option:
    """One way to get GPUs on a tier. Money in milli-credits: ``price`` per GPU (purchase),
    ``per_hour`` per GPU-hour (reserved, on-demand, spot)."""

    tier: str
    kind: str
    price: int = 0
    amortisation_months: int = 36
    power_kw: float | None = None
    per_hour: int = 0
    term_months: int = 0
    interruption_rate: float = 0.0
    max_gpus: int | None = None


@dataclass(frozen=True)
class Targets:
    max_unmet_pct: float = 5.0
    max_wait_rounds: float = 2.0


@dataclass(frozen=True)
class ScenarioDoc:
    name: str
    horizon_weeks: int
    changes: tuple[TierChange, ...] = ()
    job_gpus: int = 1
    targets: Targets = field(default_factory=Targets)
    kwh_price: int = 0
    options: tuple[Option, ...] = ()


def _credits(value: Any, where: str) -> int:
    if not isinstance(value, str) or not _CREDITS.fullmatch(value):
        raise ScenarioError(
            f'{where}: write credits as a string with at most three decimals, e.g. "2.5"'
        )
    amount = int(Decimal(value) * MILLI)
    if amount > MAX_CREDITS * MILLI:
        raise ScenarioError(f"{where}: at most {MAX_CREDITS:,} credits")
    return amount


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ScenarioError(f"{where}: a whole number from {low:,} to {high:,}")
    return value


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ScenarioError(f"{where}: a number from {low:g} to {high:g}")
    return float(value)


def _slug(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SLUG.fullmatch(value):
        raise ScenarioError(f"{where}: a tier slug (lower-case letters, digits, hyphens)")
    return value


def _known(item: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise ScenarioError(f"{where}: unknown field(s) {', '.join(extra)}")


def _change(item: Any, where: str) -> TierChange:
    if not isinstance(item, dict):
        raise ScenarioError(f'{where}: an object such as {{"tier": "a100", "add_gpus": 8}}')
    if "new_tier" in item:
        _known(item, {"new_tier", "name", "gpus", "reserve"}, where)
        return TierChange(
            tier=_slug(item["new_tier"], f"{where}.new_tier"),
            add_gpus=_whole(item.get("gpus"), f"{where}.gpus", 1, MAX_GPUS),
            reserve=_credits(item.get("reserve", "0"), f"{where}.reserve"),
            new=True,
            name=str(item.get("name", item["new_tier"]))[:120],
        )
    _known(item, {"tier", "add_gpus", "reserve"}, where)
    if "add_gpus" not in item and "reserve" not in item:
        raise ScenarioError(f"{where}: give add_gpus, reserve or both")
    return TierChange(
        tier=_slug(item.get("tier"), f"{where}.tier"),
        add_gpus=_whole(item.get("add_gpus", 0), f"{where}.add_gpus", -MAX_GPUS, MAX_GPUS),
        reserve=_credits(item["reserve"], f"{where}.reserve") if "reserve" in item else None,
    )


def _option(item: Any, where: str) -> Option:
    if not isinstance(item, dict):
        raise ScenarioError(f"{where}: an object with tier and kind")
    kind = item.get("kind")
    if kind not in OPTION_KINDS:
        raise ScenarioError(f"{where}.kind: one of {', '.join(OPTION_KINDS)}")
    tier = _slug(item.get("tier"), f"{where}.tier")
    max_gpus = item.get("max_gpus")
    limit = None if max_gpus is None else _whole(max_gpus, f"{where}.max_gpus", 0, MAX_GPUS)
    if kind == "purchase":
        _known(
            item, {"tier", "kind", "price", "amortisation_months", "power_kw", "max_gpus"}, where
        )
        power = item.get("power_kw")
        return Option(
            tier=tier,
            kind=kind,
            price=_credits(item.get("price"), f"{where}.price"),
            amortisation_months=_whole(
                item.get("amortisation_months", 36), f"{where}.amortisation_months", 1, 120
            ),
            power_kw=None if power is None else _number(power, f"{where}.power_kw", 0, 10),
            max_gpus=limit,
        )
    allowed = {"tier", "kind", "per_hour", "max_gpus"}
    allowed |= {"term_months"} if kind == "reserved" else set()
    allowed |= {"interruption_rate"} if kind == "spot" else set()
    _known(item, allowed, where)
    return Option(
        tier=tier,
        kind=kind,
        per_hour=_credits(item.get("per_hour"), f"{where}.per_hour"),
        term_months=(
            _whole(item.get("term_months", 12), f"{where}.term_months", 1, 60)
            if kind == "reserved"
            else 0
        ),
        interruption_rate=(
            _number(item.get("interruption_rate", 0.0), f"{where}.interruption_rate", 0, 0.95)
            if kind == "spot"
            else 0.0
        ),
        max_gpus=limit,
    )


def scenario_parse(document: Any) -> ScenarioDoc:
    """A validated scenario, or ScenarioError naming the first field to fix."""
    if not isinstance(document, dict):
        raise ScenarioError('the scenario is a JSON object, e.g. {"name": ..., "horizon_weeks": 4}')
    _known(
        document,
        {"name", "horizon_weeks", "changes", "job_gpus", "targets", "kwh_price", "options"},
        "scenario",
    )
    name = document.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 120:
        raise ScenarioError("name: a name of 1 to 120 characters")
    changes = document.get("changes", [])
    options = document.get("options", [])
    if not isinstance(changes, list) or len(changes) > 50:
        raise ScenarioError("changes: a list of at most 50 tier changes")
    if not isinstance(options, list) or len(options) > 100:
        raise ScenarioError("options: a list of at most 100 options")
    targets = document.get("targets", {})
    if not isinstance(targets, dict):
        raise ScenarioError("targets: an object with max_unmet_pct and max_wait_rounds")
    _known(targets, {"max_unmet_pct", "max_wait_rounds"}, "targets")
    parsed_changes = tuple(_change(c, f"changes[{i}]") for i, c in enumerate(changes))
    touched = [c.tier for c in parsed_changes]
    if len(set(touched)) != len(touched):
        raise ScenarioError("changes: one entry per tier (merge the changes to a tier)")
    return ScenarioDoc(
        name=name.strip(),
        horizon_weeks=_whole(document.get("horizon_weeks", 4), "horizon_weeks", 1, MAX_WEEKS),
        changes=parsed_changes,
        job_gpus=_whole(document.get("job_gpus", 1), "job_gpus", 1, 1_000),
        targets=Targets(
            max_unmet_pct=_number(
                targets.get("max_unmet_pct", 5.0), "targets.max_unmet_pct", 0, 100
            ),
            max_wait_rounds=_number(
                targets.get("max_wait_rounds", 2.0), "targets.max_wait_rounds", 0, 10_000
            ),
        ),
        kwh_price=_credits(document.get("kwh_price", "0"), "kwh_price"),
        options=tuple(_option(o, f"options[{i}]") for i, o in enumerate(options)),
    )
