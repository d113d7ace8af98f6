"""``/metrics`` in the Prometheus text exposition format (version 0.0.4).

Platform-wide aggregates only (no tenant names): round and bid counts, tier capacity and the
last clearing price, fleet health, enforcement actions, ledger totals and the audit length.
Every figure is one cheap aggregate query; nothing here scans raw samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from django.db.models import Count, Max, Q, Sum

from audit.models import AuditEvent
from core.ratelimit import rate_limit_fail_open_counts
from market.models import Bid, Round, Tier
from telemetry.models import EnforcementAction, Gpu, Node
from tenants.models import Account


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """A sample value with every digit: integers as they are, floats in their shortest
    round-trip form (``:g`` kept six digits: 1234567 read 1.23457e+06)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help_text = name, kind, help_text
        self.samples: list[tuple[dict[str, object], float]] = []

    def add(self, value: float, **labels: object) -> None:
        self.samples.append((labels, value))

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help_text}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            number = _number(value)
            yield f"{self.name}{{{body}}} {number}" if body else f"{self.name} {number}"


def metrics_collect() -> list[_Family]:
    """Every family the metrics endpoint serves, in the order it serves them."""
    return [
        *_market_families(),
        *_node_families(),
        *_fleet_families(),
        *_ledger_families(),
        _rate_limit_family(),
    ]


def _market_families() -> list[_Family]:
    """Rounds, open bids, and each tier's offer and last price."""
    rounds = _Family("gpumarket_rounds", "gauge", "Rounds by status.")
    counts = dict(Round.objects.values_list("status").annotate(n=Count("id")))
    for status in Round.Status.values:
        rounds.add(counts.get(status, 0), status=status)

    bids = _Family("gpumarket_bids_open", "gauge", "Bids open in rounds not yet cleared.")
    bids.add(Bid.objects.filter(status=Bid.Status.OPEN).count())

    capacity = _Family(
        "gpumarket_tier_offered_gpus", "gauge", "GPUs a tier offers to the next round."
    )
    price = _Family(
        "gpumarket_tier_price_millicredits",
        "gauge",
        "Clearing price of the last settled round, milli-credits per GPU-hour.",
    )
    last = (
        Round.objects.filter(status__in=[Round.Status.SETTLED, Round.Status.FINISHED])
        .order_by("-starts_at")
        .values_list("prices", flat=True)
        .first()
        or {}
    )
    for tier in Tier.objects.filter(active=True).order_by("slug"):
        capacity.add(tier.offered, tier=tier.slug)
        if tier.slug in last:
            price.add(last[tier.slug], tier=tier.slug)
    return [rounds, bids, capacity, price]


def _node_families() -> list[_Family]:
    """Nodes by health, how recently they reported, and what ingest refused of them."""
    nodes = _Family("gpumarket_nodes", "gauge", "Registered nodes by health (revoked excluded).")
    node_counts = Node.objects.filter(revoked_at__isnull=True).aggregate(
        up=Count("id", filter=Q(healthy=True)), down=Count("id", filter=Q(healthy=False))
    )
    nodes.add(node_counts["up"], state="healthy")
    nodes.add(node_counts["down"], state="unhealthy")
    simulated = _Family(
        "gpumarket_nodes_simulated", "gauge", "Nodes whose agent reports a simulated backend."
    )
    simulated.add(Node.objects.filter(revoked_at__isnull=True, simulated=True).count())
    last_seen = Node.objects.aggregate(at=Max("last_seen_at"))["at"]
    seen = _Family(
        "gpumarket_node_report_last_seconds", "gauge", "Unix time of the newest node report."
    )
    if last_seen is not None:
        seen.add(last_seen.timestamp())

    refused = _Family(
        "gpumarket_ingest_refused_batches_total",
        "counter",
        "Batches of a node refused whole after it authenticated (its reports are not getting in).",
    )
    dropped = _Family(
        "gpumarket_ingest_refused_fields_total",
        "counter",
        "Process claims (allocation, Slurm job, pod) dropped from a node's accepted batches.",
    )
    for name, batches, fields in Node.objects.filter(revoked_at__isnull=True).values_list(
        "name", "refused_batches", "refused_fields"
    ):
        refused.add(batches, node=name)
        dropped.add(fields, node=name)
    return [nodes, simulated, seen, refused, dropped]


def _fleet_families() -> list[_Family]:
    """GPUs by tier and state; enforcement actions by action and state."""
    gpus = _Family("gpumarket_gpus", "gauge", "GPUs by tier and state.")
    for row in Gpu.objects.values("tier__slug", "healthy", "maintenance").annotate(n=Count("id")):
        state = (
            "maintenance" if row["maintenance"] else ("healthy" if row["healthy"] else "unhealthy")
        )
        gpus.add(row["n"], tier=row["tier__slug"], state=state)

    actions = _Family(
        "gpumarket_enforcement_actions", "gauge", "Enforcement actions by action and state."
    )
    for row in EnforcementAction.objects.values("action", "state").annotate(n=Count("id")):
        actions.add(row["n"], action=row["action"], state=row["state"])
    return [gpus, actions]


def _ledger_families() -> list[_Family]:
    """Account balances by kind and the audit log's length."""
    ledger = _Family(
        "gpumarket_ledger_balance_millicredits", "gauge", "Sum of account balances by account kind."
    )
    totals = dict(Account.objects.values_list("kind").annotate(total=Sum("balance")))
    for kind in Account.Kind.values:
        ledger.add(totals.get(kind, 0), kind=kind)

    audit_len = _Family("gpumarket_audit_events", "gauge", "Events in the audit log.")
    audit_len.add(AuditEvent.objects.aggregate(n=Max("seq"))["n"] or 0)
    return [ledger, audit_len]


def _rate_limit_family() -> _Family:
    fail_open = _Family(
        "gpumarket_rate_limit_fail_open_total",
        "counter",
        "Requests let through uncounted because the rate-limit cache was unreachable "
        "(this web process, since it started).",
    )
    for scope, n in rate_limit_fail_open_counts().items():
        fail_open.add(n, scope=scope)
    return fail_open


def metrics_render() -> str:
    from telemetry.energy_metrics import energy_families  # it builds on _Family above
    from telemetry.operator_metrics import operator_families  # it builds on _Family above

    families = [*metrics_collect(), *operator_families(), *energy_families()]
    return "\n".join(line for family in families for line in family.lines()) + "\n"
