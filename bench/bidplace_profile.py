"""Statements and time per bid on one connection: ``bid_place`` called directly, then
``POST /api/v1/bids`` through Django's test client with a real API token and the Redis
throttle. Run by hand; needs PostgreSQL and Redis as for the tests, and drops and recreates
its own database:

    .venv/bin/python bench/bidplace_profile.py [--bids 300] [--profile FILE]

Prints the SQL of one bid and one request; per bid and per request the wall ms, the CPU ms of
this process (Python: Django, DRF, psycopg) and of its PostgreSQL backend (read from /proc, so
PostgreSQL must run on this host), which other work on the machine inflates far less than the
wall time; the CPU of the request's serializers alone (the bid's JSON parsed and checked, the
answer built); and with --profile cProfile stats of 100 requests in FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set


def _statements(label: str, captured: list[dict]) -> None:
    print(f"{label}: {len(captured)} statements")
    for query in captured:
        print("   ", query["sql"][:120])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=300, help="bids timed each way")
    parser.add_argument("--profile", help="write cProfile stats of 100 requests here")
    args = parser.parse_args(argv)
    url = os.environ.get(
        "BIDPROFILE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_bidprofile"
    )
    redis_url = os.environ.get("BIDPROFILE_REDIS_URL", "redis://127.0.0.1:6379/11")
    _database_reset(url)
    os.environ.update(
        _django_env(url, "bidprofile"),
        CACHE_URL=redis_url,
        ALLOWED_HOSTS="testserver",
        DB_CONN_MAX_AGE="60",
        GPUMARKET_API_BID_RATE="1000000/minute",  # as in bench/bidstorm.py
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from market.api.serializers import BidCreateSerializer, BidSerializer
    from market.services.bids import bid_place
    from market.services.policy import policy_activate, policy_version_create
    from market.services.rounds import round_open_next
    from market.services.tiers import tier_create
    from tenants.ledger import credits_grant, ledger_verify
    from tenants.models import Membership
    from tenants.services import member_add, tenant_create
    from tenants.services.tokens import token_create

    call_command("migrate", verbosity=0)
    # The Redis database is not flushed: it may be a bench's broker next door, and the rate
    # is lifted so far above what one connection sends that old counters cannot matter.
    tier_create(actor=None, slug="a100", name="A100", capacity=64)
    version = policy_version_create(
        actor=None, mechanism="welfare", round_minutes=60, reserve_prices={"a100": 1000}
    )
    policy_activate(version=version, actor=None)
    rnd = round_open_next(now=timezone.now())
    tenant = tenant_create(name="Profile", actor=None)
    credits_grant(tenant=tenant, amount=10**12, reason="profile", actor=None)
    user = member_add(
        tenant=tenant, username="profile", role=Membership.Role.RESEARCHER, actor=None
    ).user
    secret = token_create(user=user, name="profile").secret
    # As the API authenticates it: the user with its membership and tenant.
    user = get_user_model().objects.select_related("membership__tenant").get(pk=user.pk)
    tenant = user.membership.tenant

    def place() -> None:
        bid_place(user=user, tenant=tenant, round=rnd, quantity=2, limits={"a100": 3000})

    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = json.dumps({"round": rnd.pk, "quantity": 1, "limits": {"a100": "3.000"}})

    def post() -> None:
        response = client.post("/api/v1/bids", data=body, content_type="application/json")
        if response.status_code != 201:
            raise RuntimeError(f"{response.status_code}: {response.content[:200]!r}")

    for _ in range(20):  # warm up: imports, the connection, the token's first use
        place()
        post()
    with CaptureQueriesContext(connection) as one:
        place()
    _statements("bid_place", one.captured_queries)
    with CaptureQueriesContext(connection) as one:
        post()
    _statements("POST /api/v1/bids", one.captured_queries)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    def backend_cpu() -> float:
        """Seconds of CPU the connection's PostgreSQL backend has used."""
        with open(f"/proc/{backend}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    parsed = json.loads(body)
    placed = bid_place(user=user, tenant=tenant, round=rnd, quantity=1, limits={"a100": 3000})

    def serializers() -> None:
        incoming = BidCreateSerializer(data=parsed)
        incoming.is_valid(raise_exception=True)
        BidSerializer(placed, context={"placed_limits": {"a100": 3000}}).data  # noqa: B018

    for label, call in (
        ("bid_place", place),
        ("POST /api/v1/bids", post),
        ("serializers of a request", serializers),
    ):
        started, cpu, pg = time.perf_counter(), time.process_time(), backend_cpu()
        for _ in range(args.bids):
            call()
        ms = (time.perf_counter() - started) * 1000 / args.bids
        cpu_ms = (time.process_time() - cpu) * 1000 / args.bids
        pg_ms = (backend_cpu() - pg) * 1000 / args.bids
        print(
            f"{label}: {ms:.1f} ms each over {args.bids} (CPU: {cpu_ms:.2f} ms here, "
            f"{pg_ms:.2f} ms PostgreSQL), load {os.getloadavg()[0]:.1f}"
        )
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(lambda: [post() for _ in range(100)])
        profile.dump_stats(args.profile)
    problems = ledger_verify()
    print("verify-ledger:", problems or "clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
