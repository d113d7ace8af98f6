"""A round's open with standing orders: ``orders_bid`` turning N live orders into N bids in
bulk, against the anchor of the same N bids placed one by one with ``bid_place`` (what a
script per order would do), in the same run, alternating. Run by hand; needs PostgreSQL as
for the tests, and drops and recreates its own database:

    .venv/bin/python bench/orders_open.py [--orders 1000] [--tenants 200] [--repeat 2]

Prints seconds, bids per second and statements for each way, and the ratio. The figures go
to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    url = os.environ.get("ORDERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_orders")
    _database_reset(url)
    os.environ.update(_django_env(url, "ordersopen"))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from market.models import Order, Round
    from market.services import (
        bid_place,
        order_create,
        orders_bid,
        policy_activate,
        policy_version_create,
        round_open_next,
        tier_create,
    )
    from tenants.ledger import credits_grant, ledger_verify
    from tenants.services import member_add, tenant_create

    call_command("migrate", verbosity=0)
    tier_create(actor=None, slug="a100", name="A100", capacity=64)
    tier_create(actor=None, slug="h100", name="H100", capacity=32)
    version = policy_version_create(
        actor=None,
        mechanism="welfare",
        round_minutes=60,
        reserve_prices={"a100": 1000, "h100": 2000},
    )
    policy_activate(version=version, actor=None)
    teams = []
    for i in range(args.tenants):
        tenant = tenant_create(name=f"Team {i}", actor=None)
        credits_grant(tenant=tenant, amount=10**9, reason="bench", actor=None)
        membership = member_add(tenant=tenant, username=f"user{i}", role="researcher", actor=None)
        teams.append((tenant, membership.user))
    terms = [
        (teams[i % len(teams)], {"a100": 1500 + i % 700, "h100": 2500 + i % 900}, 1 + i % 4)
        for i in range(args.orders)
    ]
    now = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)
    for (tenant, user), values, gpus in terms:
        order_create(
            user=user,
            tenant=tenant,
            name="bench",
            values=values,
            gpus=gpus,
            min_gpus=1,
            ceiling=10**8,
            now=now,
        )
    rows = []
    for rep in range(args.repeat):
        for way in ("orders_bid", "bid_place"):
            rnd = round_open_next(now=now)
            start = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                if way == "orders_bid":
                    placed = len(orders_bid(round_id=rnd.pk, now=now).bids)
                else:
                    for (tenant, user), values, gpus in terms:
                        bid_place(
                            user=user,
                            tenant=tenant,
                            round=rnd,
                            quantity=gpus,
                            limits=values,
                            now=now,
                        )
                    placed = len(terms)
            seconds = time.perf_counter() - start
            rows.append((rep, way, placed, seconds, len(queries)))
            print(
                f"{rep} {way:10s} {placed:6d} bids {seconds:7.3f} s {placed / seconds:8.0f} "
                f"bids/s {len(queries):7d} statements",
                flush=True,
            )
            Round.objects.filter(pk=rnd.pk).update(status=Round.Status.FAILED)
            now += timedelta(hours=1)
    assert ledger_verify() == [], "ledger not clean"
    assert Order.objects.count() == args.orders
    bulk = min(r[3] for r in rows if r[1] == "orders_bid")
    single = min(r[3] for r in rows if r[1] == "bid_place")
    print(f"best: orders_bid {bulk:.3f} s, bid_place {single:.3f} s, ratio {single / bulk:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
