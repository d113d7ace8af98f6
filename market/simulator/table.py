"""The comparison table, and the goals our mechanisms are held to against the baselines."""

from __future__ import annotations

import math

from market.simulator.metrics import Summary

PER_TENANT_COLUMNS = 8  # above this many tenants, spend is shown as a total only


def _credits(milli: int) -> str:
    return f"{milli / 1000:,.1f}"


def _num(value: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{digits}f}"


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.1%}"


def markdown_table(summaries: list[Summary]) -> str:
    """One row per policy, in Markdown."""
    tenants = sorted({t for s in summaries for t in s.spend})
    per_tenant = len(tenants) <= PER_TENANT_COLUMNS
    spend_head = [f"spent t{t} (credits)" for t in tenants] if per_tenant else ["spent (credits)"]
    head = [
        "policy",
        "finished",
        "utilisation",
        "mean JCT (h)",
        "p95 JCT (h)",
        "makespan (h)",
        "worst rho",
        "worst rho (>= 1 h)",
        "rho > 1",
        "short jobs",
        "short worst rho",
        "mean N",
        "Jain",
        "preemptions/job (mean, max)",
        *spend_head,
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        spend = (
            [_credits(s.spend.get(t, 0)) for t in tenants]
            if per_tenant
            else [_credits(s.spend_total)]
        )
        cells = [
            s.policy,
            f"{s.finished}/{s.jobs}",
            f"{s.utilisation:.3f}",
            _num(s.jct_mean_h),
            _num(s.jct_p95_h),
            _num(s.makespan_h, 1),
            _num(s.rho_worst),
            _num(s.rho_worst_hour),
            _pct(s.rho_over_one),
            str(s.short_jobs),
            _num(s.short_rho_worst),
            _num(s.contention_mean, 1),
            f"{s.jain:.3f}",
            f"{s.preemptions_mean:.1f}, {s.preemptions_max}",
            *spend,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _compare(label: str, ours: float, theirs: float, *, lower_is_better: bool) -> str:
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return f"- {label}: not measurable (ours {ours}, baseline {theirs})"
    met = ours <= theirs + 1e-9 if lower_is_better else ours >= theirs - 1e-9
    if met:
        return f"- {label}: met ({ours:.3g} vs {theirs:.3g})"
    gap = ours - theirs
    relative = f" ({abs(gap) / abs(theirs):.1%})" if theirs else ""
    return f"- {label}: MISSED by {abs(gap):.3g}{relative} ({ours:.3g} vs {theirs:.3g})"


def goals(summaries: list[Summary]) -> list[str]:
    """The issue's goals for our mechanisms, checked on whichever rows are present."""
    by = {s.policy: s for s in summaries}
    lines: list[str] = []
    if "maxmin" in by and "gavel-maxmin" in by:
        ours, theirs = by["maxmin"], by["gavel-maxmin"]
        lines.append(
            _compare(
                "maxmin worst rho <= Gavel max-min's",
                ours.rho_worst,
                theirs.rho_worst,
                lower_is_better=True,
            )
        )
        lines.append(
            _compare(
                "maxmin share of jobs with rho > 1 <= Gavel max-min's",
                ours.rho_over_one,
                theirs.rho_over_one,
                lower_is_better=True,
            )
        )
    if "welfare" in by and "gavel-maxsum" in by:
        lines.append(
            _compare(
                "welfare mean JCT (h) <= Gavel max-sum throughput's",
                by["welfare"].jct_mean_h,
                by["gavel-maxsum"].jct_mean_h,
                lower_is_better=True,
            )
        )
    fifo = by.get("fifo") or by.get("fcfs")
    if fifo is not None:
        for name in ("welfare", "fisher", "maxmin"):
            if name in by:
                lines.append(
                    _compare(
                        f"{name} utilisation >= FIFO's",
                        by[name].utilisation,
                        fifo.utilisation,
                        lower_is_better=False,
                    )
                )
    return lines
