"""Reading a large round out of PostgreSQL: how long ``round_data`` takes to turn a round's
open bids and their limits into arrays, before any solver runs. Run by hand; needs
PostgreSQL as for the tests, and drops and recreates its own database:

    .venv/bin/python bench/round_read.py [--bids 1000000] [--tenants 1000]

The bids are written with one INSERT ... SELECT each for bids and limits (two tiers a bid),
not through the services: what is measured is the read. Prints the seconds of each of three
reads and the rows read; docs/clearing.md records the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _env  # noqa: E402 - after the path is set

TIERS = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=3)
    args = parser.parse_args(argv)
    url = os.environ.get(
        "ROUNDREAD_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_roundread"
    )
    _database_reset(url)
    env = _env(url, "redis://127.0.0.1:6379/12")
    env["GPUMARKET_AUDIT_CHECKPOINT_PATH"] = f"/tmp/roundread-{uuid.uuid4().hex}.jsonl"
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from market.models import Tier
    from market.services import (
        policy_activate,
        policy_version_create,
        round_data,
        round_open_next,
        tier_create,
    )
    from tenants.models import Membership
    from tenants.services import member_add, tenant_create

    call_command("migrate", verbosity=0)
    for t in range(TIERS):
        tier_create(actor=None, slug=f"t{t}", name=f"Tier {t}", capacity=10_000)
    version = policy_version_create(actor=None, mechanism="welfare", round_minutes=60)
    policy_activate(version=version, actor=None)
    rnd = round_open_next(now=timezone.now())
    tenants, users = [], []
    for n in range(args.tenants):
        tenant = tenant_create(name=f"Read {n}", actor=None)
        user = member_add(
            tenant=tenant, username=f"read{n}", role=Membership.Role.RESEARCHER, actor=None
        ).user
        tenants.append(tenant.pk)
        users.append(user.pk)
    tiers = list(Tier.objects.order_by("pk").values_list("pk", flat=True))
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO market_bid (tenant_id, author_id, round_id, quantity, min_quantity,
                escrow, status, note, outcome, outcome_reason, idempotency_key, created_at,
                updated_at)
            SELECT (%(tenants)s::bigint[])[1 + g %% %(n)s], (%(users)s::bigint[])[1 + g %% %(n)s],
                %(round)s, 1 + g %% 4, 0, 1000 * (1 + g %% 97), 'open', '', '', '', '',
                now(), now()
            FROM generate_series(1, %(bids)s) AS g
            """,
            {
                "tenants": tenants,
                "users": users,
                "n": args.tenants,
                "round": rnd.pk,
                "bids": args.bids,
            },
        )
        cursor.execute(
            """
            INSERT INTO market_bidlimit (bid_id, tier_id, price)
            SELECT b.id, (%(tiers)s::bigint[])[1 + (b.id + 3 * k) %% %(t)s],
                1000 + (b.id * 37 + k * 11) %% 50000
            FROM market_bid AS b, generate_series(0, 1) AS k
            WHERE b.round_id = %(round)s
            """,
            {"tiers": tiers, "t": TIERS, "round": rnd.pk},
        )
        cursor.execute("ANALYZE market_bid; ANALYZE market_bidlimit")
    print(
        f"wrote {args.bids} bids and {2 * args.bids} limits in {time.perf_counter() - start:.1f} s"
    )
    for _ in range(args.reads):
        start = time.perf_counter()
        data = round_data(rnd)
        seconds = time.perf_counter() - start
        print(
            f"round_data: {seconds:.2f} s for {data.bid_ids.size} bids, "
            f"{int((data.limits > 0).sum())} limits",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
