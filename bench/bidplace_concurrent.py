"""Bids a second from several processes calling ``bid_place`` on one round at once, and how
busy the machine's cores were meanwhile. Run by hand; needs PostgreSQL as for the tests, and
drops and recreates its own database:

    .venv/bin/python bench/bidplace_concurrent.py [--processes 1 2 4] [--seconds 10]

Each process is one team's researcher bidding flat out. When more processes place no more
bids while the cores stay partly idle, the bids wait on a lock rather than on the CPU.
docs/market.md records the figures.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set


def _cpu() -> tuple[int, int]:
    """Jiffies since boot over all cores: (total, idle and waiting on I/O)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def _bidder(user_id: int, round_id: int, start: float, seconds: float, counts) -> None:
    from django.contrib.auth import get_user_model

    from market.services.bids import bid_place

    user = get_user_model().objects.select_related("membership__tenant").get(pk=user_id)
    tenant = user.membership.tenant

    def place() -> None:
        bid_place(user=user, tenant=tenant, round=round_id, quantity=1, limits={"a100": 3000})

    for _ in range(20):  # warm up
        place()
    while time.time() < start:
        time.sleep(0.001)
    placed = 0
    while time.time() < start + seconds:
        place()
        placed += 1
    counts.put(placed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    url = os.environ.get(
        "BIDCONCURRENT_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_bidconcurrent"
    )
    os.environ.update(
        _django_env(url, "bidconcurrent"), ALLOWED_HOSTS="localhost", DB_CONN_MAX_AGE="60"
    )
    _database_reset(url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from market.services.policy import policy_activate, policy_version_create
    from market.services.rounds import round_open_next
    from market.services.tiers import tier_create
    from tenants.ledger import credits_grant, ledger_verify
    from tenants.models import Membership
    from tenants.services import member_add, tenant_create

    call_command("migrate", verbosity=0)
    tier_create(actor=None, slug="a100", name="A100", capacity=64)
    version = policy_version_create(
        actor=None, mechanism="welfare", round_minutes=60, reserve_prices={"a100": 1000}
    )
    policy_activate(version=version, actor=None)
    round_id = round_open_next(now=timezone.now()).pk
    users = []
    for i in range(max(args.processes)):
        tenant = tenant_create(name=f"Concurrent {i}", actor=None)
        credits_grant(tenant=tenant, amount=10**12, reason="bench", actor=None)
        role = Membership.Role.RESEARCHER
        users.append(member_add(tenant=tenant, username=f"c{i}", role=role, actor=None).user.pk)
    connection.close()  # each process opens its own

    for processes in args.processes:
        counts = multiprocessing.Queue()
        start = time.time() + 3
        workers = [
            multiprocessing.Process(
                target=_bidder, args=(user, round_id, start, args.seconds, counts)
            )
            for user in users[:processes]
        ]
        for worker in workers:
            worker.start()
        while time.time() < start:
            time.sleep(0.001)
        total0, idle0 = _cpu()
        time.sleep(args.seconds)
        total1, idle1 = _cpu()
        placed = sum(counts.get() for _ in workers)
        for worker in workers:
            worker.join()
        busy = 1 - (idle1 - idle0) / (total1 - total0)
        print(
            f"{processes} processes: {placed / args.seconds:.1f} bids/s, cores {busy:.0%} busy "
            f"({os.cpu_count()} cores), load {os.getloadavg()[0]:.1f}"
        )
    problems = ledger_verify()
    print("verify-ledger:", problems or "clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
