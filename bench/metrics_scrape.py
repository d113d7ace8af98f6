"""What a /metrics scrape and the efficiency pages cost on a busy fleet, against anchors from
the same run: the platform-wide families /metrics had before (``metrics_collect``) and one
plain aggregate over the same minute rollups the efficiency selectors read.

A benchmark, not a test. It drops and re-creates its own database, writes a fleet straight to
the tables (``--gpus`` GPUs on nodes of 8, ``--teams`` teams, every hour of ``--days`` days
each team holding ``gpus / teams`` GPUs placed, a minute rollup per GPU and minute, an hour of
raw samples per GPU), then times each read ``--repeat`` times and reports the median:

    .venv/bin/python bench/metrics_scrape.py [--gpus 32] [--teams 16] [--days 7] [--repeat 5]

Needs PostgreSQL as for the tests (``METRICS_BENCH_DATABASE_URL``, default
postgres://postgres@127.0.0.1:5432/gm_bench_metrics). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _env  # noqa: E402 - after the path is set


def _seed(args) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from market.models import Allocation, Bid, Round
    from market.services.policy import policy_active
    from market.services.tiers import tier_create
    from telemetry.models import Gpu, Node, Sample, SampleMinute
    from tenants.ledger import credits_charge, credits_grant, credits_hold
    from tenants.services import tenant_create

    now = timezone.now().replace(second=0, microsecond=0)
    tier = tier_create(actor=None, slug="a100", name="A100")
    policy = policy_active()
    nodes = Node.objects.bulk_create(
        Node(
            name=f"node-{n}",
            tier=tier,
            token_prefix=f"p{n}",
            token_hash="0" * 64,
            healthy=True,
            last_seen_at=now,
        )
        for n in range((args.gpus + 7) // 8)
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=nodes[i // 8],
            uuid=f"GPU-{i}",
            index=i % 8,
            name="A100",
            tier=tier,
            memory_total_mib=81920,
            last_seen_at=now,
        )
        for i in range(args.gpus)
    )
    teams = [tenant_create(name=f"Team {t}", actor=None) for t in range(args.teams)]
    per_team = max(args.gpus // args.teams, 1)
    start = now.replace(minute=0) - timedelta(days=args.days)
    hours = args.days * 24
    rounds = Round.objects.bulk_create(
        Round(
            policy=policy,
            status=Round.Status.FINISHED,
            opens_at=start + timedelta(hours=h - 2),
            closes_at=start + timedelta(hours=h - 1),
            starts_at=start + timedelta(hours=h),
            ends_at=start + timedelta(hours=h + 1),
            cleared_at=start + timedelta(hours=h - 1, seconds=2),
            settled_at=start + timedelta(hours=h - 1, seconds=3),
            diagnostics={"total_seconds": 0.5},
        )
        for h in range(hours)
    )
    author = get_user_model().objects.create_user("bench-author")
    bids = Bid.objects.bulk_create(
        Bid(tenant=team, author=author, round=rnd, quantity=per_team, status=Bid.Status.WON)
        for rnd in rounds
        for team in teams
    )
    Allocation.objects.bulk_create(
        Allocation(
            tenant=bid.tenant,
            round=bid.round,
            bid=bid,
            tier=tier,
            gpus=per_team,
            price=2000,
            charge=2000 * per_team,
            placement=[
                {"node": g.node.name, "index": g.index, "uuid": g.uuid}
                for g in gpus[t * per_team : (t + 1) * per_team]
            ],
            starts_at=bid.round.starts_at,
            ends_at=bid.round.ends_at,
            status=Allocation.Status.FINISHED,
        )
        for i, bid in enumerate(bids)
        for t in [i % args.teams]
    )
    for team in teams:
        credits_grant(tenant=team, amount=10**9, reason="bench", actor=None)
        credits_hold(tenant=team, amount=10**6, reference="bench")
        credits_charge(tenant=team, amount=5 * 10**5, reference="bench")
    minutes = hours * 60
    batch: list[SampleMinute] = []
    for g, gpu in enumerate(gpus):
        for m in range(minutes):
            util = float((g * 7 + m) % 100)
            batch.append(
                SampleMinute(
                    gpu=gpu,
                    minute=start + timedelta(minutes=m),
                    samples=6,
                    utilization_avg=util,
                    utilization_max=util,
                    memory_used_avg=1024,
                    memory_used_max=1024,
                    power_avg=300,
                    power_max=300,
                    temperature_max=60,
                    energy_j_last=18_000.0 * m,
                )
            )
            if len(batch) >= 20_000:
                SampleMinute.objects.bulk_create(batch)
                batch.clear()
    SampleMinute.objects.bulk_create(batch)
    Sample.objects.bulk_create(
        Sample(
            gpu=gpu,
            at=now - timedelta(seconds=10 * s),
            utilization_pct=50,
            memory_used_mib=1024,
            memory_total_mib=81920,
            power_w=300,
            temperature_c=60,
            energy_j=1.0,
        )
        for gpu in gpus
        for s in range(360)
    )


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--teams", type=int, default=16)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--reuse", action="store_true", help="time the database the last run wrote (no re-seed)"
    )
    args = parser.parse_args(argv)
    url = os.environ.get(
        "METRICS_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_bench_metrics"
    )
    if not args.reuse:
        _database_reset(url)
    os.environ.update(_env(url, "redis://127.0.0.1:6379/12"))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum
    from django.utils import timezone

    from telemetry.efficiency.selectors import efficiency_by_day, teams_by_idle_spend
    from telemetry.metrics import metrics_collect, metrics_render
    from telemetry.models import SampleMinute
    from telemetry.operator_metrics import operator_families
    from tenants.models import Tenant

    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    if not args.reuse:
        _seed(args)
    seeded = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    team = Tenant.objects.order_by("pk").first()
    since = timezone.now() - timedelta(days=args.days)
    body = metrics_render()
    figures = {
        "anchor_metrics_collect_s": _median_seconds(metrics_collect, args.repeat),
        "operator_families_s": _median_seconds(operator_families, args.repeat),
        "metrics_render_s": _median_seconds(metrics_render, args.repeat),
        "anchor_minute_scan_s": _median_seconds(
            lambda: SampleMinute.objects.filter(minute__gte=since).aggregate(
                Sum("utilization_avg")
            ),
            args.repeat,
        ),
        "team_by_day_s": _median_seconds(
            lambda: efficiency_by_day(tenant=team, days=args.days), args.repeat
        ),
        "teams_by_idle_spend_s": _median_seconds(
            lambda: teams_by_idle_spend(days=args.days), args.repeat
        ),
    }
    print(
        json.dumps(
            {
                "gpus": args.gpus,
                "teams": args.teams,
                "days": args.days,
                "minute_rows": SampleMinute.objects.count(),
                "exposition_lines": body.count("\n"),
                "exposition_bytes": len(body),
                "seed_s": round(seeded, 1),
                **{k: round(v, 4) for k, v in figures.items()},
                "load_1m": os.getloadavg()[0],
                "python": platform.python_version(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
