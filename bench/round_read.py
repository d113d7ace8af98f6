"""A very large round on the platform's own path: read out of PostgreSQL (``round_data``) and,
with ``--clear``, solved as a round is solved (``round_clearing.solve``: the arrays from the
rows, the parts as a Celery group on the clearing_parts queue, real workers over Redis, the
combination and the outcome's checks). Run by hand; needs PostgreSQL and Redis as for the
tests, and drops and recreates its own database:

    .venv/bin/python bench/round_read.py [--bids 1000000] [--clear welfare,fisher,maxmin]
        [--workers 2]

The round is written with SQL (INSERT ... SELECT), not through the services: what is
measured is the read and the clear. Like bench/clearing.py: a tenant for every 10 bids,
quantities 1, 2, 4, 8 GPUs (55/20/15/10 %), 1-3 of 8 tiers a bid, capacity 60 % of demand
(at most 100,000 GPUs a tier, the platform's limit: 32 % at a million bids),
every weight 1. Prints the seconds of each read and clear; bench/RESULTS.md records them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _env  # noqa: E402 - after the path is set

TIERS = 8


def _round(args) -> int:
    """Writes the round; returns its id."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from market.models import Tier
    from market.services._common import MAX_GPUS
    from market.services.policy import policy_activate, policy_version_create
    from market.services.rounds import round_open_next
    from market.services.tiers import tier_create

    demand = args.bids * (0.55 * 1 + 0.2 * 2 + 0.15 * 4 + 0.1 * 8)
    # 60 % of demand, up to the most GPUs a tier may have (a million bids get 32 %).
    capacity = min(int(0.6 * demand / TIERS), MAX_GPUS)
    for t in range(TIERS):
        tier_create(actor=None, slug=f"t{t}", name=f"Tier {t}", capacity=capacity)
    version = policy_version_create(actor=None, mechanism="welfare", round_minutes=60)
    policy_activate(version=version, actor=None)
    rnd = round_open_next(now=timezone.now())
    author = get_user_model().objects.create_user(username="bench", password=uuid.uuid4().hex)
    tiers = list(Tier.objects.order_by("pk").values_list("pk", flat=True))
    tenants = max(1, args.bids // 10)
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(
            """
            INSERT INTO tenants_tenant (name, slug, weight, created_at)
            SELECT 'Bench ' || g, 'bench-' || g, 1, now() FROM generate_series(1, %s) AS g
            """,
            [tenants],
        )
        cursor.execute(
            """
            WITH draws AS (
                SELECT g, random() AS r, 1 + floor(random() * %(tenants)s)::int AS tenant
                FROM generate_series(1, %(bids)s) AS g
            )
            INSERT INTO market_bid (tenant_id, author_id, round_id, quantity, min_quantity,
                escrow, status, note, outcome, outcome_reason, idempotency_key, created_at,
                updated_at)
            SELECT t.id, %(author)s, %(round)s,
                CASE WHEN d.r < 0.55 THEN 1 WHEN d.r < 0.75 THEN 2 WHEN d.r < 0.9 THEN 4
                    ELSE 8 END,
                0, 10000000, 'open', '', '', '', '', now(), now()
            FROM draws AS d JOIN tenants_tenant AS t ON t.slug = 'bench-' || d.tenant
            ORDER BY d.g
            """,
            {"author": author.pk, "round": rnd.pk, "bids": args.bids, "tenants": tenants},
        )
        # 1-3 tiers a bid; a limit is the bid's price level (lognormal) x a tier factor.
        cursor.execute(
            """
            INSERT INTO market_bidlimit (bid_id, tier_id, price)
            SELECT b.id, (%(tiers)s::bigint[])[1 + (b.id * 7 + 3 * k) %% %(t)s],
                greatest(1000, round(1000 * exp(2 + 0.5 * b.z) * (1 + 0.15 * ((b.id + k) %% 3))))
            FROM (
                SELECT id, sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS z,
                    1 + floor(random() * 3) AS n
                FROM market_bid WHERE round_id = %(round)s
            ) AS b
            CROSS JOIN generate_series(0, 2) AS k
            WHERE k < b.n
            """,
            {"tiers": tiers, "t": TIERS, "round": rnd.pk},
        )
        cursor.execute("ANALYZE tenants_tenant; ANALYZE market_bid; ANALYZE market_bidlimit")
    return rnd.pk


def _worker(env: dict[str, str], processes: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "clearing_parts",
         "--pool", "prefork", "--concurrency", str(processes), "--loglevel", "WARNING",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    from celery import current_app

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if current_app.control.ping(timeout=1.0):
            return proc
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit("the clearing_parts worker did not answer within 60 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=3)
    parser.add_argument("--clear", default="", help="policies to clear it with, comma-separated")
    parser.add_argument("--workers", type=int, default=2, help="processes of the parts worker")
    args = parser.parse_args(argv)
    url = os.environ.get(
        "ROUNDREAD_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_roundread"
    )
    redis = os.environ.get("ROUNDREAD_REDIS_URL", "redis://127.0.0.1:6379/12")
    _database_reset(url)
    env = _env(url, redis)
    env["GPUMARKET_AUDIT_CHECKPOINT_PATH"] = f"/tmp/roundread-{uuid.uuid4().hex}.jsonl"
    env["GPUMARKET_PARTITION_TIMEOUT_SECONDS"] = "900"
    os.environ.update(env)
    import django

    django.setup()
    import redis as redis_lib
    from django.core.management import call_command

    from market.models import Round
    from market.services.partitioned import partition_parts
    from market.services.round_clearing import round_data, solve

    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    rnd = Round.objects.get(pk=_round(args))
    print(f"wrote the round ({args.bids} bids) in {time.perf_counter() - start:.1f} s")
    for _ in range(args.reads):
        start = time.perf_counter()
        data = round_data(rnd)
        print(
            f"round_data: {time.perf_counter() - start:.2f} s for {data.bid_ids.size} bids, "
            f"{int((data.limits > 0).sum())} limits",
            flush=True,
        )
    if not args.clear:
        return 0
    redis_lib.Redis.from_url(redis).flushdb()
    worker = _worker(env, args.workers)
    try:
        for mechanism in args.clear.split(","):
            policy = rnd.policy
            policy.mechanism = mechanism
            start = time.perf_counter()
            data = round_data(rnd)
            read = time.perf_counter() - start
            outcome = solve(data=data, policy=policy)
            total = time.perf_counter() - start
            d = outcome.diagnostics
            print(
                f"{mechanism}: {total:.2f} s in all (read {read:.2f} s, "
                f"{partition_parts(int(data.bid_ids.size), mechanism=mechanism)} parts on "
                f"{args.workers} processes, "
                f"slowest part {max(d['part_seconds']):.2f} s, parts' sum "
                f"{sum(d['part_seconds']):.1f} s), {int(outcome.gpus.sum())} GPUs awarded, "
                f"{d['guarantees_unmet']} guarantees unmet, status {d['status']}\n"
                f"    here: read {read:.2f} s, arrays {d['arrays_seconds']:.2f} s, split "
                f"{d['split_seconds']:.2f} s, parts sent and back {d['parts_elapsed_seconds']:.2f}"
                f" s, combined {d['combine_seconds']:.2f} s",
                flush=True,
            )
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
