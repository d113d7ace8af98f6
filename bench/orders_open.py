"""A round's open with standing orders: ``orders_bid`` turning N live orders into N bids in
bulk, against the anchor of a bare COPY of the same rows, in the same run, alternating. Run
by hand; needs PostgreSQL as for the tests, and drops and recreates its own database:

    .venv/bin/python bench/orders_open.py [--orders 1000] [--tenants 200] [--repeat 2]
    .venv/bin/python bench/orders_open.py --one-by-one    # also bid_place once per order
    .venv/bin/python bench/orders_open.py --probe         # and how long audited writes wait

The anchor: every row ``orders_bid`` inserted (bids, their limits, the holds' transfers,
entries and idempotency records, the audit events), read back as tuples before the clock
starts and written again by psycopg's COPY, in one committed transaction, into tables made
``LIKE`` the real ones with their indexes, checks and foreign keys. It is what writing these
rows costs with no work per row in Python: ``orders_bid``'s ratio to it is the share of the
opening spent writing. ``--one-by-one`` adds the older anchor, the same bids placed one by
one with ``bid_place`` (what a script per order would do; slow: about 20 s per 1,000).

Prints seconds, bids per second and statements for each way, and the ratio, then checks the
ledger and the audit chain (verify-ledger, verify-audit). With ``--probe``, while
``orders_bid`` runs, a second connection takes the audit chain's lock every 5 ms, as every
audited write does (a bid, a grant, an admin's change): the longest it waited is how long the
opening holds those writes up. The figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set

# The tables orders_bid inserts into (rows keyed by a growing id), in the order it writes.
WRITTEN = (
    "market_bid",
    "market_bidlimit",
    "tenants_transfer",
    "tenants_entry",
    "tenants_ledgeroperation",
    "audit_auditevent",
)


def anchor_tables(cursor) -> None:
    """anchor_<table> for each written table: its columns, defaults, checks, indexes and
    foreign keys (to the same tables the real one points at), empty."""
    for table in WRITTEN:
        cursor.execute(f"DROP TABLE IF EXISTS anchor_{table}")
        cursor.execute(f"CREATE TABLE anchor_{table} (LIKE {table} INCLUDING ALL)")
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'f'",
            [table],
        )
        for name, definition in cursor.fetchall():
            cursor.execute(f"ALTER TABLE anchor_{table} ADD CONSTRAINT a_{name} {definition}")


def last_ids(cursor) -> dict[str, int]:
    ids = {}
    for table in WRITTEN:
        cursor.execute(f"SELECT coalesce(max(id), 0) FROM {table}")
        ids[table] = cursor.fetchone()[0]
    return ids


def rows_since(cursor, since: dict[str, int]) -> dict[str, tuple[list[str], list[tuple]]]:
    """Each written table's rows with an id above ``since``: its column names and rows."""
    rows = {}
    for table in WRITTEN:
        cursor.execute(f"SELECT * FROM {table} WHERE id > %s ORDER BY id", [since[table]])
        rows[table] = ([c.name for c in cursor.description], cursor.fetchall())
    return rows


def bare_copy(connection, rows: dict[str, tuple[list[str], list[tuple]]]) -> float:
    """Seconds to COPY ``rows`` into the anchor tables in one transaction, committed."""
    raw = connection.connection  # psycopg's own connection, under Django's
    with raw.cursor() as cursor:
        for table in WRITTEN:
            cursor.execute(f"TRUNCATE anchor_{table}")
    raw.commit()
    start = time.perf_counter()
    with raw.transaction(), raw.cursor() as cursor:
        for table in WRITTEN:
            names, values = rows[table]
            columns = ", ".join(f'"{n}"' for n in names)
            with cursor.copy(f"COPY anchor_{table} ({columns}) FROM STDIN") as copy:
                for row in values:
                    copy.write_row(row)
    return time.perf_counter() - start


class ChainProbe:
    """Takes the audit chain's lock every 5 ms on a connection of its own, in a thread, and
    keeps the longest wait: ``with ChainProbe(url, key) as probe: ...; probe.longest``."""

    def __init__(self, url: str, key: int) -> None:
        self.url, self.key, self.longest = url, key, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url) as conn:
            self._ready.set()
            while not self._stop.is_set():
                start = time.perf_counter()
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", [self.key])
                self.longest = max(self.longest, time.perf_counter() - start)
                time.sleep(0.005)

    def __enter__(self) -> ChainProbe:
        self._thread.start()
        self._ready.wait(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--one-by-one", action="store_true", help="also place the bids one by one (slow)"
    )
    parser.add_argument(
        "--probe", action="store_true", help="also how long audited writes wait meanwhile"
    )
    args = parser.parse_args(argv)
    url = os.environ.get("ORDERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_orders")
    _database_reset(url)
    os.environ.update(_django_env(url, "ordersopen"))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from audit.selectors import chain_verify
    from audit.services import CHAIN_LOCK_KEY
    from market.models import Order, Round
    from market.services.bids import bid_place
    from market.services.orders.lifecycle import order_create
    from market.services.orders.opening import orders_bid
    from market.services.policy import policy_activate, policy_version_create
    from market.services.rounds import round_open_next
    from market.services.tiers import tier_create
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
    with connection.cursor() as cursor:
        anchor_tables(cursor)
    ways = ("orders_bid", "bare COPY") + (("bid_place",) if args.one_by_one else ())
    rows = []
    for rep in range(args.repeat):
        written = None
        for way in ways:
            statements, stall = 0, ""
            if way == "bare COPY":
                placed = len(written["market_bid"][1])
                seconds = bare_copy(connection, written)
                statements = len(WRITTEN)
            else:
                rnd = round_open_next(now=now)
                with connection.cursor() as cursor:
                    since = last_ids(cursor)
                probe = (
                    ChainProbe(url, CHAIN_LOCK_KEY) if args.probe and way == "orders_bid" else None
                )
                with probe or contextlib.nullcontext():
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
                if probe:
                    stall = f", audited writes waited up to {probe.longest:.3f} s"
                statements = len(queries)
                if way == "orders_bid":
                    with connection.cursor() as cursor:
                        written = rows_since(cursor, since)
                Round.objects.filter(pk=rnd.pk).update(status=Round.Status.FAILED)
                now += timedelta(hours=1)
            rows.append((rep, way, placed, seconds))
            print(
                f"{rep} {way:10s} {placed:6d} bids {seconds:7.3f} s {placed / seconds:8.0f} "
                f"bids/s {statements:7d} statements{stall}",
                flush=True,
            )
        counts = ", ".join(f"{len(written[t][1])} {t}" for t in WRITTEN)
        print(f"  rows written by orders_bid: {counts}", flush=True)
    assert ledger_verify() == [], "ledger not clean"
    chain = chain_verify()
    assert chain.ok, chain.describe()
    print(f"verify-ledger clean; {chain.describe()}", flush=True)
    assert Order.objects.count() == args.orders
    best = {way: min(r[3] for r in rows if r[1] == way) for way in ways}
    text = ", ".join(f"{way} {best[way]:.3f} s" for way in ways)
    print(f"best: {text}; orders_bid is {best['bare COPY'] / best['orders_bid']:.2f}x bare COPY")
    if args.one_by_one:
        print(f"bid_place one by one / orders_bid: {best['bid_place'] / best['orders_bid']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
