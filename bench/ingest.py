"""Ingest rate: samples per second through the HTTP endpoint into PostgreSQL, against the bare
COPY rate of the same rows (text COPY, the anchor of the goal, and binary COPY, the format
the endpoint writes), and a multi-row INSERT, to show why the endpoint uses COPY.

A benchmark, not a test. It makes its own database (dropped and re-created on each run),
starts the app under gunicorn on 127.0.0.1, and posts pre-encoded batches from client
threads, so the client's JSON encoding is not part of the figure. Every ``--chunk`` batches
posted, the bare copies of the same rows run, so the anchor sees the load the posts saw.
Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gm_bench_ingest \
        python bench/ingest.py [--batches 60] [--batch-samples 2000] [--workers 2]

Results go to stdout as one JSON object; docs/telemetry.md records them with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the project is the import root

INGEST = "/api/v1/telemetry/ingest"


def _database_reset(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _server_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DEBUG="0",
        SECRET_KEY="bench-" + uuid.uuid4().hex,
        GPUMARKET_AUDIT_KEYS="bench:" + uuid.uuid4().hex,
        GPUMARKET_METRICS_TOKEN="bench-" + uuid.uuid4().hex,
        SECURE_SSL_REDIRECT="0",
        ALLOWED_HOSTS="127.0.0.1",
        # Persistent connections, as in production: a new connection per request would
        # cost more than a small batch's insert.
        DB_CONN_MAX_AGE="60",
        LOG_LEVEL="WARNING",
        # A few nodes stand in for thousands here, each posting far faster than a real one:
        # lift the per-node rate limit, which this benchmark does not measure.
        GPUMARKET_INGEST_RATE_PER_MINUTE="100000000",
        # Every body is made (and stamped sent_at) before the clock starts; on a loaded host
        # the last is posted minutes later, beyond the default 120 s of allowed skew.
        GPUMARKET_CLOCK_SKEW_SECONDS="3600",
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bodies(
    *, tokens: list[tuple[str, str]], batches: int, per_batch: int, gpus: int
) -> list[tuple[str, bytes, int]]:
    """(token, JSON body, samples) per batch, round-robin over the nodes. Each batch is one
    node's backlog: ``per_batch / gpus`` readings of each of its GPUs, one second apart."""
    ticks = per_batch // gpus
    now = datetime.now(UTC)
    out = []
    for b in range(batches):
        name, token = tokens[b % len(tokens)]
        # Later batches of a node carry later readings, as a draining backlog would.
        end = now - timedelta(seconds=(batches - b) * ticks)
        samples = []
        for t in range(ticks):
            at = (end + timedelta(seconds=t)).isoformat()
            for g in range(gpus):
                samples.append(
                    {
                        "gpu": f"GPU-BENCH-{name}-{g}",
                        "at": at,
                        "utilization_pct": (t * 7 + g) % 101,
                        "memory_used_mib": 20000 + g,
                        "memory_total_mib": 81920,
                        "power_w": 250.5,
                        "temperature_c": 61.0,
                        "energy_j": 1000.0 * t,
                        "processes": [
                            {
                                "pid": 1000 + g,
                                "memory_mib": 18000,
                                "allocation": None,
                                "slurm_job": None,
                                "pod": None,
                                "state": "running",
                            }
                        ]
                        if t == ticks - 1
                        else [],
                    }
                )
        body = {
            "batch_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "backend": "simulated",
            "agent_version": "bench",
            "hostname": name,
            "gpus": [
                {
                    "uuid": f"GPU-BENCH-{name}-{g}",
                    "index": g,
                    "name": "Bench GPU",
                    "memory_total_mib": 81920,
                }
                for g in range(gpus)
            ],
            "samples": samples,
            "directive_results": [],
        }
        out.append((token, json.dumps(body).encode(), len(samples)))
    return out


def _post_all(url: str, bodies: list[tuple[str, bytes, int]], concurrency: int) -> float:
    import requests

    sessions = [requests.Session() for _ in range(concurrency)]

    def post(i: int) -> int:
        token, body, n = bodies[i]
        response = sessions[i % concurrency].post(
            url + INGEST,
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=60,
        )
        if response.status_code != 200 or response.json()["stored"] != n:
            raise RuntimeError(f"batch {i}: HTTP {response.status_code} {response.text[:300]}")
        return n

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        # Threads take batches in order; one node's batches are serialised by the server
        # (a row lock on the node), as one agent's posts would be.
        list(pool.map(post, range(len(bodies))))
    return time.perf_counter() - started


def _rows(bodies: list[tuple[str, bytes, int]], gpu_ids: dict[str, int]) -> list[tuple]:
    rows = []
    for _, body, _ in bodies:
        for s in json.loads(body)["samples"]:
            rows.append(
                (
                    gpu_ids[s["gpu"]],
                    datetime.fromisoformat(s["at"])
                    + timedelta(days=1),  # distinct from the HTTP rows
                    s["utilization_pct"],
                    s["memory_used_mib"],
                    s["memory_total_mib"],
                    s["power_w"],
                    s["temperature_c"],
                    s["energy_j"],
                )
            )
    return rows


def _copy_seconds(rows: list[tuple]) -> float:
    from django.db import connection, transaction

    from telemetry.models import Sample
    from telemetry.services.ingest import _SAMPLE_COLUMNS

    statement = f"COPY {Sample._meta.db_table} ({', '.join(_SAMPLE_COLUMNS)}) FROM STDIN"
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)
    return time.perf_counter() - started


def _copy_binary_seconds(rows: list[tuple]) -> float:
    """The same rows by binary COPY, two days on (distinct from the other copies)."""
    from django.db import connection, transaction

    from telemetry.models import Sample
    from telemetry.services.ingest import _SAMPLE_COLUMNS

    shifted = [(r[0], r[1] + timedelta(days=2), *r[2:]) for r in rows]
    types = [Sample._meta.get_field(name).db_type(connection) for name in _SAMPLE_COLUMNS]
    statement = (
        f"COPY {Sample._meta.db_table} ({', '.join(_SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    )
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        copy.set_types(types)
        for row in shifted:
            copy.write_row(row)
    return time.perf_counter() - started


def _insert_seconds(rows: list[tuple]) -> float:
    from django.db import transaction

    from telemetry.models import Sample
    from telemetry.services.ingest import _SAMPLE_COLUMNS

    shifted = [(r[0], r[1] + timedelta(days=3), *r[2:]) for r in rows]
    started = time.perf_counter()
    with transaction.atomic():
        Sample.objects.bulk_create(
            [Sample(**dict(zip(_SAMPLE_COLUMNS, r, strict=True))) for r in shifted],
            batch_size=2000,
        )
    return time.perf_counter() - started


def _machine() -> dict[str, object]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # Other work on the machine skews every figure here: the load average says how much.
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--batch-samples", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--concurrency", type=int, default=2, help="client threads")
    parser.add_argument(
        "--chunk", type=int, default=10, help="batches posted between two rounds of copies"
    )
    args = parser.parse_args(argv)

    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gm_bench_ingest")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must point at PostgreSQL")
    _database_reset(url)
    env = _server_env(url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.db import connection

    from market.models import Tier
    from telemetry.models import Gpu, Sample
    from telemetry.services import node_register

    tier = Tier.objects.create(slug="bench", name="Bench tier")
    tokens = []
    for n in range(args.nodes):
        node, token = node_register(name=f"bench{n}", tier=tier, actor="bench")
        tokens.append((node.name, token))
    warmup = _bodies(tokens=tokens, batches=args.nodes, per_batch=args.gpus, gpus=args.gpus)
    bodies = _bodies(
        tokens=tokens, batches=args.batches, per_batch=args.batch_samples, gpus=args.gpus
    )
    total = sum(n for _, _, n in bodies)

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
            "--log-level",
            "warning",
            # On a loaded host a worker's first import can take longer than the default 30 s.
            "--timeout",
            "300",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        deadline = time.monotonic() + 300
        while True:
            try:
                if requests.get(base + INGEST, timeout=1).status_code == 405:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.2)
        # GPU discovery and connection set-up happen here, outside the timing.
        _post_all(base, warmup, concurrency=1)
        gpu_ids = dict(Gpu.objects.values_list("uuid", "pk"))
        # The HTTP posts and the bare copies of the same rows take turns, a chunk of batches
        # at a time, so both see the same load on a shared machine (a run measured in two
        # long phases moved its ratio by 3x with the load between them).
        elapsed = copy_seconds = binary_seconds = insert_seconds = 0.0
        for start in range(0, len(bodies), args.chunk):
            chunk = bodies[start : start + args.chunk]
            elapsed += _post_all(base, chunk, concurrency=args.concurrency)
            rows = _rows(chunk, gpu_ids)
            copy_seconds += _copy_seconds(rows)
            binary_seconds += _copy_binary_seconds(rows)
            insert_seconds += _insert_seconds(rows)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    stored = Sample.objects.count() - sum(n for _, _, n in warmup) - 3 * total
    if stored != total:
        raise RuntimeError(f"{total} samples posted but {stored} stored")
    copy_rate = total / copy_seconds
    binary_rate = total / binary_seconds
    insert_rate = total / insert_seconds
    http_rate = total / elapsed
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": _machine() | {"postgresql": pg_version},
        "command": "python bench/ingest.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "samples": total,
        "batches": args.batches,
        "samples_per_batch": args.batch_samples,
        "gunicorn_workers": args.workers,
        "client_threads": args.concurrency,
        "http_seconds": round(elapsed, 3),
        "http_samples_per_s": round(http_rate),
        "bare_copy_samples_per_s": round(copy_rate),
        "bare_binary_copy_samples_per_s": round(binary_rate),
        "bulk_insert_samples_per_s": round(insert_rate),
        "http_to_copy_ratio": round(http_rate / copy_rate, 3),
        "http_to_binary_copy_ratio": round(http_rate / binary_rate, 3),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
