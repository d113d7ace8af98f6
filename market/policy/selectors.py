"""Reads for the policy pages: versions, the alerts and rounds beside them, and the shadow
comparison (each settled round's recorded outcome beside the shadow version's). The replay of
past rounds under a candidate, which runs the solver, is ``market.policy.replay``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from market.diagnostics import JAIN, diagnostic
from market.models import Allocation, PolicyVersion, Round
from tenants.models import Notification, Tenant

REPLAYABLE = (Round.Status.SETTLED, Round.Status.FINISHED, Round.Status.VOIDED)


def versions_list() -> list[PolicyVersion]:
    return list(PolicyVersion.objects.select_related("parent", "created_by").order_by("-number"))


def version_get(*, number: int) -> PolicyVersion:
    """The policy version numbered ``number``, with its parent, or Http404."""
    return get_object_or_404(PolicyVersion.objects.select_related("parent"), number=number)


def versions_children(*, version: PolicyVersion) -> QuerySet[PolicyVersion]:
    """The versions drafted from ``version``, oldest first."""
    return PolicyVersion.objects.filter(parent=version).order_by("number")


def round_allocations_to_revoke(*, rnd: Round) -> QuerySet[Allocation]:
    """The round's allocations with their team and tier, in the order they were made (what
    voiding the round revokes)."""
    return rnd.allocations.select_related("tenant", "tier").order_by("pk")


def policy_alerts(*, limit: int = 10) -> QuerySet[Notification]:
    """The newest notices admins got about guardrails and voided rounds."""
    return Notification.objects.filter(tenant=None, kind__in=["policy_guardrail", "round_voided"])[
        :limit
    ]


def _mean(values: list[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return mean(present) if present else None


@dataclass(frozen=True)
class Side:
    """One policy's outcome for one round."""

    policy: int | None  # version number
    prices: dict[str, int]
    allocated: dict[str, int]
    gpus_by_tenant: dict[str, int]
    revenue: int
    utilisation: float | None
    fairness: float | None
    error: str = ""


@dataclass(frozen=True)
class ComparisonRow:
    round: Round
    active: Side
    other: Side


@dataclass
class ComparisonTotals:
    rounds: int = 0
    revenue_active: int = 0
    revenue_other: int = 0
    gpus_active: int = 0
    gpus_other: int = 0
    utilisation_active: float | None = None
    utilisation_other: float | None = None
    fairness_active: float | None = None
    fairness_other: float | None = None
    tenants: list[tuple[str, int, int]] = field(default_factory=list)  # (name, active, other)
    errors: int = 0


def comparison_totals(rows: list[ComparisonRow]) -> ComparisonTotals:
    totals = ComparisonTotals(rounds=len(rows))
    per_tenant: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        totals.revenue_active += row.active.revenue
        totals.revenue_other += row.other.revenue
        totals.gpus_active += sum(row.active.allocated.values())
        totals.gpus_other += sum(row.other.allocated.values())
        totals.errors += bool(row.other.error)
        for tenant, gpus in row.active.gpus_by_tenant.items():
            per_tenant[tenant][0] += gpus
        for tenant, gpus in row.other.gpus_by_tenant.items():
            per_tenant[tenant][1] += gpus
    totals.utilisation_active = _mean([r.active.utilisation for r in rows])
    totals.utilisation_other = _mean([r.other.utilisation for r in rows])
    totals.fairness_active = _mean([r.active.fairness for r in rows])
    totals.fairness_other = _mean([r.other.fairness for r in rows])
    names = dict(
        Tenant.objects.filter(pk__in=[int(k) for k in per_tenant]).values_list("pk", "name")
    )
    totals.tenants = sorted(
        (names.get(int(k), f"tenant {k}"), a, o) for k, (a, o) in per_tenant.items()
    )
    return totals


def side_utilisation(allocated: dict[str, int], capacities: dict[str, Any]) -> float | None:
    """GPUs allocated / GPUs offered, over every tier of the round (None if nothing offered).

    Computed here from the allocations rather than read from the solver's diagnostics, so the
    recorded, shadow and replayed sides are measured the same way.
    """
    offered = sum(int(v) for v in (capacities or {}).values())
    return sum(allocated.values()) / offered if offered else None


def side_fairness(diagnostics: dict[str, Any]) -> float | None:
    value = diagnostic(diagnostics, JAIN)
    return float(value) if isinstance(value, int | float) else None


def recorded_side(rnd: Round) -> Side:
    """What the active version actually did in ``rnd`` (its allocations and diagnostics)."""
    allocated: dict[str, int] = defaultdict(int)
    by_tenant: dict[str, int] = defaultdict(int)
    revenue = 0
    for slug, tenant_id, gpus, charge in Allocation.objects.filter(round=rnd).values_list(
        "tier__slug", "tenant_id", "gpus", "charge"
    ):
        allocated[slug] += gpus
        by_tenant[str(tenant_id)] += gpus
        revenue += charge
    diagnostics = rnd.diagnostics or {}
    return Side(
        policy=rnd.policy.number,
        prices={k: int(v) for k, v in (rnd.prices or {}).items()},
        allocated=dict(allocated),
        gpus_by_tenant=dict(by_tenant),
        revenue=revenue,
        utilisation=side_utilisation(allocated, rnd.capacities),
        fairness=side_fairness(diagnostics),
    )


def _shadow_side(rnd: Round, result: dict[str, Any]) -> Side:
    allocated = {k: int(v) for k, v in (result.get("allocated") or {}).items()}
    diagnostics = result.get("diagnostics") or {}
    fairness = result.get("fairness")
    return Side(
        policy=result.get("number"),
        prices={k: int(v) for k, v in (result.get("prices") or {}).items()},
        allocated=allocated,
        gpus_by_tenant={k: int(v) for k, v in (result.get("gpus_by_tenant") or {}).items()},
        revenue=int(result.get("revenue") or 0),
        utilisation=side_utilisation(allocated, rnd.capacities),
        fairness=float(fairness)
        if isinstance(fairness, int | float)
        else side_fairness(diagnostics),
        error=str(result.get("error") or ""),
    )


def shadow_comparison(*, last: int = 48) -> tuple[list[ComparisonRow], ComparisonTotals]:
    """The last ``last`` settled rounds that were also cleared by a shadow version."""
    rounds = list(
        Round.objects.filter(status__in=REPLAYABLE, shadow_result__isnull=False)
        .select_related("policy", "shadow_policy")
        .order_by("-starts_at")[:last]
    )
    rows = [
        ComparisonRow(round=r, active=recorded_side(r), other=_shadow_side(r, r.shadow_result))
        for r in rounds
    ]
    return rows, comparison_totals(rows)
