"""A very large round settled on PostgreSQL: every bid's escrow held, the round cleared, then
``round_settle`` timed (the allocations, a charge and a release per bid, their entries,
balances, idempotency records and audit events, in one transaction), and the ledger
verified. Run by hand; needs PostgreSQL as for the tests, and drops and recreates its own
database:

    .venv/bin/python bench/settlement.py [--bids 100000] [--fail] [--profile FILE]

The round is the one bench/round_read.py writes with SQL (a tenant for every 10 bids, 1-3 of
8 tiers a bid, each bid holding 10,000 credits). Each tenant's accounts are written with SQL;
its credits are granted and every bid's escrow held through ``transfer_execute_many``, as
settlement moves them, so the ledger is whole before the round closes. The round is cleared
by welfare in this process (the embedded broker: parts, if any, are cleared here too). With
``--fail`` the round is failed instead of settled (every escrow released). Prints the seconds
of each step; bench/RESULTS.md records them.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bidstorm import _database_reset, _django_env  # noqa: E402 - after the path is set
from round_read import _round  # noqa: E402


def _timed(label: str, call):
    start = time.perf_counter()
    out = call()
    print(f"{label}: {time.perf_counter() - start:.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=100_000)
    parser.add_argument("--fail", action="store_true", help="fail the round instead of settling")
    parser.add_argument("--profile", help="write cProfile stats of the settlement here")
    args = parser.parse_args(argv)
    url = os.environ.get(
        "SETTLEMENT_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_settlement"
    )
    _database_reset(url)
    os.environ.update(_django_env(url, "settlement"))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count

    from market.models import Bid, Round
    from market.services.round_clearing import round_clear
    from market.services.settlement import round_settle
    from market.services.void import round_fail
    from tenants.ledger import TransferOrder, ledger_verify, transfer_execute_many
    from tenants.models import Tenant

    call_command("migrate", verbosity=0)
    rnd = Round.objects.get(pk=_timed(f"wrote the round ({args.bids} bids)", lambda: _round(args)))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tenants_account (tenant_id, kind, balance) SELECT t.id, k.kind, 0 "
            "FROM tenants_tenant AS t CROSS JOIN (VALUES ('available'), ('escrow')) AS k(kind)"
        )
    tenants = Tenant.objects.in_bulk()
    bids = list(
        Bid.objects.filter(round=rnd).order_by("pk").values_list("pk", "tenant_id", "escrow")
    )
    need: dict[int, int] = {}
    for _, tenant_id, escrow in bids:
        need[tenant_id] = need.get(tenant_id, 0) + escrow
    grants = [
        TransferOrder(kind="grant", tenant=tenants[pk], amount=amount, reason="bench")
        for pk, amount in need.items()
    ]
    holds = [
        TransferOrder(
            kind="hold",
            tenant=tenants[tenant_id],
            amount=escrow,
            reference=f"bid:{pk}",
            idempotency_key=f"bench-hold:{pk}",
        )
        for pk, tenant_id, escrow in bids
    ]
    _timed(
        f"granted {len(grants)} tenants in one batch", lambda: transfer_execute_many(orders=grants)
    )
    _timed(f"held {len(holds)} escrows in one batch", lambda: transfer_execute_many(orders=holds))
    after_close = rnd.closes_at + timedelta(seconds=1)
    if args.fail:
        _timed(
            "failed the round (every escrow released)",
            lambda: round_fail(round=rnd, reason="bench", now=after_close),
        )
    else:
        cleared = _timed("cleared (welfare)", lambda: round_clear(round_id=rnd.pk, now=after_close))
        print(f"  status {cleared.status}, {len(cleared.awards)} awards", flush=True)
        profile = cProfile.Profile() if args.profile else None
        settle = lambda: round_settle(round_id=rnd.pk, now=after_close)  # noqa: E731
        _timed("settled", (lambda: profile.runcall(settle)) if profile else settle)
        if profile:
            profile.dump_stats(args.profile)
    rnd.refresh_from_db()
    statuses = dict(Bid.objects.filter(round=rnd).values_list("status").annotate(n=Count("id")))
    print(f"round {rnd.status}; bids {statuses}", flush=True)
    # Fresh statistics, as autovacuum would have them by now on a live database: with the
    # planner's figures from before the bulk load, each batch of verify-ledger's audit lookup
    # took 0.5 s at a million bids (over ten minutes in all, against a minute).
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    problems = _timed("verify-ledger", ledger_verify)
    print("verify-ledger:", problems or "clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
