"""The two-person rule: which changes need a second admin, from settings.

``GPUMARKET_APPROVALS`` maps a kind of change to its rule: ``{}`` (every change of that kind
needs approval) or ``{"above_credits": N}`` (only one larger than N credits: a grant's amount,
a budget's raise). A kind left out is made directly by one admin. A team's request for credits
always waits for an admin: its manager cannot grant.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from governance.models import ChangeRequest
from tenants.ledger import MILLI

Kind = ChangeRequest.Kind
# Kinds whose rule may carry a threshold, and what it is compared with.
SIZED = {Kind.CREDIT_GRANT: "amount", Kind.BUDGET_RAISE: "raise_by"}
DEFAULT_APPROVALS = {
    Kind.POLICY_ACTIVATE: {},
    Kind.CREDIT_GRANT: {"above_credits": 10_000},
    Kind.TIER_CHANGE: {},
    Kind.BUDGET_RAISE: {"above_credits": 5_000},
    Kind.TENANT_WEIGHT: {},
}


@dataclass(frozen=True)
class Rule:
    kind: str
    # Milli-credits; None = every change of the kind.
    above: int | None = None

    def describe(self) -> str:
        label = Kind(self.kind).label
        if self.above is None:
            return f"{label}: always needs a second admin"
        return f"{label}: needs a second admin above {self.above // MILLI:,} credits"


def rules() -> dict[str, Rule]:
    """The configured rules, checked (read on every call, so settings changes take effect)."""
    configured = getattr(settings, "GPUMARKET_APPROVALS", None)
    if configured is None:
        configured = DEFAULT_APPROVALS
    if not isinstance(configured, dict):
        raise ImproperlyConfigured("GPUMARKET_APPROVALS must map kinds of change to rules")
    out: dict[str, Rule] = {}
    for kind, rule in configured.items():
        if kind not in Kind.values or kind == Kind.TEAM_CREDITS:
            raise ImproperlyConfigured(
                f"GPUMARKET_APPROVALS: unknown kind {kind!r}; kinds: "
                f"{sorted(set(Kind.values) - {Kind.TEAM_CREDITS})}"
            )
        if not isinstance(rule, dict) or set(rule) - {"above_credits"}:
            raise ImproperlyConfigured(
                f"GPUMARKET_APPROVALS[{kind!r}] must be {{}} or {{'above_credits': N}}"
            )
        above = rule.get("above_credits")
        if above is not None:
            if kind not in SIZED:
                raise ImproperlyConfigured(
                    f"GPUMARKET_APPROVALS[{kind!r}]: only {sorted(SIZED)} take above_credits"
                )
            if isinstance(above, bool) or not isinstance(above, int) or above < 0:
                raise ImproperlyConfigured(
                    f"GPUMARKET_APPROVALS[{kind!r}]['above_credits'] must be whole credits >= 0"
                )
            above *= MILLI
        out[kind] = Rule(kind=kind, above=above)
    return out


def approval_needed(kind: str, *, amount: int | None = None, raise_by: int | None = None) -> bool:
    """Whether a change of ``kind`` (with its size in milli-credits, for sized kinds) waits for
    a second admin."""
    if kind == Kind.TEAM_CREDITS:
        return True
    rule = rules().get(kind)
    if rule is None:
        return False
    if rule.above is None:
        return True
    size = amount if SIZED.get(kind) == "amount" else raise_by
    return size is not None and size > rule.above
