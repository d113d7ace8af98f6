"""Market data for the demo (``gpumarket demo`` calls this). Idempotent: run it on every start."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from market.models import Order, PolicyVersion, Tier
from market.selectors import policy_active_get
from market.services._common import now_or
from market.services.orders.lifecycle import order_create
from market.services.policy import policy_activate, policy_version_create
from market.services.tiers import tier_create
from tenants.models import Tenant

DEMO_TIERS = (
    # slug, name, GPU model, capacity (0: what the demo's simulated nodes report is measured
    # into it once they are up), preemptible
    ("h100-nvlink", "H100 NVLink", "NVIDIA H100 80GB SXM", 0, False),
    ("a100", "A100", "NVIDIA A100 80GB", 0, False),
    ("preemptible", "Preemptible", "mixed, may be reclaimed", 0, True),
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


@dataclass(frozen=True)
class DemoOrder:
    """A demo team's standing order. Money in milli-credits (values per GPU-hour)."""

    tenant: str
    author: str
    name: str
    values: dict[str, int]
    gpus: int
    min_gpus: int
    ceiling: int
    gpu_hours: int | None = None  # None: until cancelled
    deadline_hours: int | None = None  # from when it is first seeded
    restart_seconds: int = 300
    preemptible: bool = False  # also takes GPUs backfilled within a window


# Values well above the reserves, so each order wins its GPUs in most rounds; a 2-minute
# window at them costs at most 0.6 credits. The gang is 3 GPUs because the nodes report 4 per
# tier and a team may take 75 % of a tier (DEMO_POLICY); the two a100 orders fill the other
# node. Language Group's hard daily cap of 0.4 credits is reached within a few rounds, after
# which its bids are left out with the reason.
DEMO_ORDERS = (
    DemoOrder(
        tenant="Vision Lab",
        author="ana",
        name="ViT-H pretraining",
        values={"h100-nvlink": 6000, "a100": 2500},
        gpus=3,
        min_gpus=3,
        ceiling=2_000_000,
        restart_seconds=600,
    ),
    DemoOrder(
        tenant="Vision Lab",
        author="alice",
        name="Segmentation fine-tune",
        values={"a100": 3000},
        gpus=2,
        min_gpus=2,
        ceiling=40_000,
        gpu_hours=8,
        deadline_hours=36,
    ),
    DemoOrder(
        tenant="Language Group",
        author="bea",
        name="Translation eval",
        values={"a100": 2000},
        gpus=2,
        min_gpus=2,
        ceiling=20_000,
        gpu_hours=6,
        deadline_hours=24,
    ),
    DemoOrder(
        tenant="Language Group",
        author="bob",
        name="Tokenizer sweep",
        values={"preemptible": 600},
        gpus=4,
        min_gpus=1,
        ceiling=20_000,
        gpu_hours=4,
        restart_seconds=60,
        preemptible=True,
    ),
)


def demo_orders_seed(*, now: datetime | None = None) -> list[Order]:
    """Create the demo teams' standing orders (``DEMO_ORDERS``) that do not exist yet, found
    by team and name whatever their status, so a restart adds none. Deadlines count from
    ``now``. Needs the demo tenants, their members and the demo policy. Returns those created."""
    now = now_or(now)
    users = get_user_model().objects.in_bulk({o.author for o in DEMO_ORDERS}, field_name="username")
    tenants = Tenant.objects.in_bulk({o.tenant for o in DEMO_ORDERS}, field_name="name")
    created = []
    for spec in DEMO_ORDERS:
        tenant = tenants[spec.tenant]
        if Order.objects.filter(tenant=tenant, name=spec.name).exists():
            continue
        created.append(
            order_create(
                user=users[spec.author],
                tenant=tenant,
                name=spec.name,
                values=spec.values,
                gpus=spec.gpus,
                min_gpus=spec.min_gpus,
                gpu_seconds_wanted=None if spec.gpu_hours is None else spec.gpu_hours * 3600,
                ceiling=spec.ceiling,
                deadline=None
                if spec.deadline_hours is None
                else now + timedelta(hours=spec.deadline_hours),
                restart_seconds=spec.restart_seconds,
                preemptible=spec.preemptible,
                now=now,
            )
        )
    return created
