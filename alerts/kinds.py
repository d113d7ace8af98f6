"""What a notification is about, in the words a person chooses alerts by. Pure."""

from __future__ import annotations

CATEGORIES: dict[str, str] = {
    "budget": "Budgets and spend caps",
    "pauses": "Work paused, resumed, idle or reclaimed",
    "preemptions": "Preemptions, suspensions and GPU failures",
    "rounds": "Round results and standing orders",
    "approvals": "Approvals and credit requests",
    "other": "Everything else (policy, platform)",
}


def category(kind: str) -> str:
    """The category of a notification kind; a kind no rule knows is "other"."""
    k = kind.lower()
    if "budget" in k or k.startswith(("cap", "hard_cap", "spend")):
        return "budget"
    if k.startswith(("work_", "gpu_idle", "gpu_reclaimed")):
        return "pauses"
    if any(word in k for word in ("preempt", "suspend", "fail", "ended")) or k.startswith("gpu_"):
        return "preemptions"
    if k.startswith(("round", "backfill", "order_", "allocation")):
        return "rounds"
    if k.startswith(("approval", "request", "credit")):
        return "approvals"
    return "other"
