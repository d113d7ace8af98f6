"""Market data for the demo (``gpumarket demo`` calls this). Idempotent: run it on every start."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from market.models import PolicyVersion, Tier
from market.selectors import policy_active_get
from market.services import policy_activate, policy_version_create, tier_create

DEMO_TIERS = (
    # slug, name, GPU model, capacity, preemptible
    ("h100-nvlink", "H100 NVLink", "NVIDIA H100 80GB SXM", 8, False),
    ("a100", "A100", "NVIDIA A100 80GB", 16, False),
    ("preemptible", "Preemptible", "mixed, may be reclaimed", 8, True),
)
# Short rounds so the demo shows several auctions in a few minutes; reserves in milli-credits
# per GPU-hour (2.000 credits for an H100 hour).
DEMO_POLICY = {
    "mechanism": PolicyVersion.Mechanism.WELFARE,
    "round_minutes": 2,
    "lead_minutes": 0,
    "reserve_prices": {"h100-nvlink": 2000, "a100": 1000, "preemptible": 250},
    "max_share_pct": {"h100-nvlink": 75, "a100": 75, "preemptible": 100},
}


def _is_demo_policy(version: PolicyVersion | None) -> bool:
    return version is not None and all(getattr(version, k) == v for k, v in DEMO_POLICY.items())


@transaction.atomic
def demo_market_seed(*, actor: AbstractBaseUser | str | None) -> PolicyVersion:
    """Create the three demo tiers (existing tiers are left as they are) and make the demo
    policy (welfare, 2-minute rounds, bidding until the window starts, reserve prices) the
    active one, unless the active version already has exactly those settings. Returns it."""
    existing = set(Tier.objects.values_list("slug", flat=True))
    for slug, name, model, capacity, preemptible in DEMO_TIERS:
        if slug not in existing:
            tier_create(
                actor=actor,
                slug=slug,
                name=name,
                gpu_model=model,
                capacity=capacity,
                preemptible=preemptible,
            )
    active = policy_active_get()
    if _is_demo_policy(active):
        return active
    version = policy_version_create(actor=actor, based_on=active, note="demo policy", **DEMO_POLICY)
    return policy_activate(version=version, actor=actor)
