"""What idle reclaim and backfill buy on the demo's fleet (not a test): the platform's own
services run N one-hour windows on the demo's three simulated nodes (4 GPUs each of
h100-nvlink, a100 and preemptible) with the demo's standing orders, whose work leaves its
GPUs idle part of each window, once without idle reclaim and backfill and once with them,
and print the fleet's utilisation (GPU-hours used / GPU-hours available) for each.

    .venv/bin/python bench/capacity.py [--windows 4]

Needs PostgreSQL as for the tests; drops and recreates its own database
(CAPACITY_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/gm_capacity) for each run.
A simulated clock drives, every minute: the market clock (``rounds_tick``: rounds opened,
cleared, settled and finished, backfill sub-rounds), one telemetry sample per GPU (written as
ingestion stores it; the work's utilisation from its profile below), and the idle scan
(``idle_reclaim_scan``). A GPU is *used* in a minute when the work holding it computes then:
a round's winner on its GPUs until reclaimed, a backfill winner on the GPUs it took.

Work profiles (minutes of each window the work computes, from the window's or the backfill's
start; idle afterwards): ViT-H pretraining (3 H100) the whole window; Segmentation
fine-tune (2 A100) 20; Translation eval (2 A100) 30; Tokenizer sweep (4 preemptible) 30;
and two orders of a third team (Ablations, Sim rollouts: A100 and preemptible), which
compute whatever they are given. With backfill every order accepts preemptible capacity.
Policy with reclaim: every tier, 15 idle minutes, 5 minutes' grace, half the unused time
refunded; sub-rounds every 5 minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set

# order name -> minutes of a window (or of a backfill) its work computes; None: all of it
PROFILE = {
    "ViT-H pretraining": None,
    "Segmentation fine-tune": 20,
    "Translation eval": 30,
    "Tokenizer sweep": 30,
    "Ablations": None,
    "Sim rollouts": None,
}
BUSY_PCT, IDLE_PCT = 90.0, 1.0
POLICY = {"below_pct": 5, "idle_minutes": 15, "grace_minutes": 5, "refund_pct": 50}


def run(*, windows: int, spare: bool) -> dict[str, float]:
    """One fresh platform, ``windows`` one-hour windows; the fleet's figures."""
    from django.core.management import call_command
    from django.utils import timezone

    call_command("migrate", verbosity=0)
    from market.demo import DEMO_ORDERS, DEMO_POLICY, demo_market_seed
    from market.models import Allocation, Order, Reclaim, Tier
    from market.services.orders.lifecycle import order_create
    from market.services.policy import policy_activate, policy_active, policy_version_create
    from market.services.tick import rounds_tick
    from telemetry.models import Gpu, Node, Sample
    from telemetry.services import node_register, tier_capacity_refresh
    from telemetry.services.idle import idle_reclaim_scan
    from tenants.ledger import MILLI, credits_grant, ledger_verify
    from tenants.services import member_add, tenant_create

    demo_market_seed(actor=None)
    params = {"backfill_minutes": 5}
    if spare:
        params["idle_reclaim"] = {slug: POLICY for slug in DEMO_POLICY["reserve_prices"]}
    version = policy_version_create(
        actor=None,
        based_on=policy_active(),
        round_minutes=60,
        lead_minutes=0,
        params=params,
    )
    policy_activate(version=version, actor=None)
    teams = {}
    for name in ("Vision Lab", "Language Group", "Robotics"):
        teams[name] = tenant_create(name=name, actor=None)
        credits_grant(tenant=teams[name], amount=10**6 * MILLI, reason="bench", actor=None)
    users = {}
    for spec in DEMO_ORDERS:
        if spec.author not in users:
            users[spec.author] = member_add(
                tenant=teams[spec.tenant], username=spec.author, role="researcher", actor=None
            ).user
    users["rita"] = member_add(
        tenant=teams["Robotics"], username="rita", role="researcher", actor=None
    ).user
    specs = [
        (spec.tenant, spec.author, spec.name, spec.values, spec.gpus, spec.min_gpus)
        for spec in DEMO_ORDERS
    ]
    specs += [
        ("Robotics", "rita", "Ablations", {"a100": 1500, "preemptible": 300}, 2, 1),
        ("Robotics", "rita", "Sim rollouts", {"a100": 1200, "preemptible": 300}, 2, 1),
    ]
    for tenant, author, name, values, gpus, min_gpus in specs:
        order_create(
            user=users[author],
            tenant=teams[tenant],
            name=name,
            values=values,
            gpus=gpus,
            min_gpus=min_gpus,
            ceiling=10**5 * MILLI,
            restart_seconds=60,
            # With backfill every order also takes preemptible capacity; without, none does.
            preemptible=spare,
        )
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
    for index, slug in enumerate(("h100-nvlink", "a100", "preemptible")):
        tier = Tier.objects.get(slug=slug)
        node, _token = node_register(name=f"sim-node-{'abc'[index]}", tier=tier, actor=None)
        Node.objects.filter(pk=node.pk).update(healthy=True, last_seen_at=start)
        Gpu.objects.bulk_create(
            Gpu(
                node=node,
                uuid=f"GPU-{node.name}-{i}",
                index=i,
                name="Simulated GPU",
                tier=tier,
                memory_total_mib=81920,
            )
            for i in range(4)
        )
        tier_capacity_refresh(tiers=[tier])
    gpus = {g.uuid: g for g in Gpu.objects.all()}
    orders = dict(Order.objects.values_list("pk", "name"))

    def computing(allocation: Allocation, at) -> bool:
        minutes = PROFILE[orders[allocation.bid.order_id]]
        return minutes is None or at < allocation.starts_at + timedelta(minutes=minutes)

    used = available = 0
    measure_from = start + timedelta(hours=1)  # the first window: bids open an hour ahead
    measure_to = measure_from + timedelta(hours=windows)
    at = start - timedelta(minutes=1)
    started = time.perf_counter()
    while at < measure_to:
        rounds_tick(now=at)
        Node.objects.update(last_seen_at=at)
        live = list(
            Allocation.objects.filter(
                status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
                starts_at__lte=at,
                ends_at__gt=at,
            ).select_related("bid")
        )
        reclaimed = set(
            Reclaim.objects.filter(
                status=Reclaim.Status.RECLAIMED, allocation__in=live
            ).values_list("allocation_id", "gpu_uuid")
        )
        busy: set[str] = set()
        for allocation in sorted(live, key=lambda a: a.preemptible):  # backfill last
            for gpu in allocation.placement:
                if (allocation.pk, gpu["uuid"]) in reclaimed:
                    busy.discard(gpu["uuid"])  # its owner's work there is paused
                elif computing(allocation, at):
                    busy.add(gpu["uuid"])
        Sample.objects.bulk_create(
            Sample(
                gpu=gpu,
                at=at,
                utilization_pct=BUSY_PCT if uuid in busy else IDLE_PCT,
                memory_used_mib=1000,
                memory_total_mib=81920,
                power_w=300 if uuid in busy else 60,
                temperature_c=60,
                energy_j=0,
            )
            for uuid, gpu in gpus.items()
        )
        idle_reclaim_scan(now=at)
        if measure_from <= at < measure_to:
            used += len(busy)
            available += len(gpus)
        at += timedelta(minutes=1)
    problems = ledger_verify()
    return {
        "utilisation": used / available,
        "used_gpu_hours": used / 60,
        "available_gpu_hours": available / 60,
        "reclaims": Reclaim.objects.filter(status=Reclaim.Status.RECLAIMED).count(),
        "backfilled_gpus": sum(
            a.gpus for a in Allocation.objects.filter(preemptible=True, starts_at__lt=measure_to)
        ),
        "ledger_problems": len(problems),
        "seconds": time.perf_counter() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4, help="one-hour windows measured")
    parser.add_argument("--spare", choices=("no", "yes"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = os.environ.get("CAPACITY_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_capacity")
    if args.spare is None:
        # Each run in a process of its own, on a fresh database.
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        print(
            f"Demo fleet (12 GPUs), {args.windows} one-hour windows; {platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, commit {commit}.\n"
        )
        print(
            "| idle reclaim + backfill | utilisation | GPU-hours used | GPU-hours available "
            "| GPUs reclaimed | GPUs backfilled | ledger problems | wall (s) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for spare in ("no", "yes"):
            done = subprocess.run(
                [sys.executable, __file__, "--windows", str(args.windows), "--spare", spare],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                return done.returncode
            rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
            print("\n".join(rows), flush=True)  # without the solver's banner
        return 0
    _database_reset(url)
    os.environ.update(_django_env(url, "capacity"))
    import django

    django.setup()
    r = run(windows=args.windows, spare=args.spare == "yes")
    print(
        f"| {args.spare} | {r['utilisation']:.3f} | {r['used_gpu_hours']:.1f} "
        f"| {r['available_gpu_hours']:.1f} | {r['reclaims']} | {r['backfilled_gpus']} "
        f"| {r['ledger_problems']} | {r['seconds']:.0f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
