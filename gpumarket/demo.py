"""``gpumarket demo``: the whole platform on the embedded default, in one command.

SQLite under ``var/``, the file-based broker, one Celery worker with beat embedded, two
simulated nodes (real OS processes standing in for GPU jobs), and Django's development
server. The demo teams' standing orders bid in every round, so the market pages fill up, and
each order's allocation gets a simulated job that keeps running across the rounds it wins;
one process on the second node runs without an allocation, so the enforcement loop pauses it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

logger = logging.getLogger("gpumarket.demo")

DEMO_PASSWORD = "demo-password"
ADMIN = ("admin", "admin-password")
TENANTS = (
    # name, weight, credits, (username, role)...
    ("Vision Lab", 1, 400_000, (("alice", "manager"), ("ana", "researcher"))),
    ("Language Group", 1, 250_000, (("bob", "manager"), ("bea", "researcher"))),
)
# Small daily caps so that, with two-minute rounds, a visitor sees them bite within minutes:
# a soft cap raises alerts at 50/80/100 %; a hard cap pauses the team's running work (and
# cancels its open bids) until an admin raises it or the day rolls over. Milli-credits.
BUDGETS = {
    "Vision Lab": ("day", "soft", 600),
    "Language Group": ("day", "hard", 400),
}
NODES = (
    # node name (before demo_nodes makes it this demo's own), tier slug, simulated GPUs
    ("sim-node-a", "h100-nvlink", 4),
    ("sim-node-b", "a100", 4),
    # A tier sells only the GPUs healthy nodes report (docs/capacity.md).
    ("sim-node-c", "preemptible", 4),
)


def demo_nodes(var: Path) -> tuple[tuple[str, str, int], ...]:
    """NODES, named for this demo: ``sim-node-a-<6 hex of the var dir>``.

    A simulated agent adopts every process tagged with its node's name, so two demos (or a
    demo and a test run) on one host that used the same names would pause and terminate each
    other's work; the var dir is what makes a demo a platform of its own.
    """
    platform = hashlib.sha256(str(var.resolve()).encode()).hexdigest()[:6]
    return tuple((f"{name}-{platform}", tier, gpus) for name, tier, gpus in NODES)


RESTARTS = 5  # a child that keeps stopping is left stopped after this many restarts


@dataclass
class Children:
    """The demo's worker and agents: each started with its log under ``log_dir``, and
    started again (saying so on the console) if it stops while the demo runs."""

    log_dir: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)

    def start(self, name: str, cmd: list[str], extra_env: dict[str, str] | None = None) -> None:
        from telemetry.agent.simulated_backend import exit_with_parent

        self.commands[name] = (cmd, dict(extra_env or {}))
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        self.procs[name] = subprocess.Popen(
            cmd,
            preexec_fn=exit_with_parent(signal.SIGTERM),
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()  # the child holds its own copy

    def revive(self) -> list[str]:
        """Start again every child that has stopped; returns a console line for each."""
        lines = []
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            done = self.restarts.get(name, 0)
            log = self.log_dir / f"{name}.log"
            if done >= RESTARTS:
                if done == RESTARTS:
                    lines.append(f"{name} stopped again (exit {code}); left stopped, see {log}")
                    self.restarts[name] = done + 1
                continue
            self.restarts[name] = done + 1
            lines.append(f"{name} stopped (exit {code}); started again, see {log}")
            self.start(name, *self.commands[name])
        return lines

    def stop(self) -> None:
        self.restarts = {name: RESTARTS + 1 for name in self.procs}  # no more restarts
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _supervise(stop: threading.Event, children: Children, interval: float = 2.0) -> None:
    while not stop.wait(interval):
        for line in children.revive():
            print(line, flush=True)


def _seed(var: Path) -> dict[str, str]:
    """Idempotent demo data; returns node name -> its agent token.

    Tokens are stored hashed, so the demo keeps the ones it was shown in ``var/`` (readable
    by this user only) to hand them to its agents again on the next start.
    """
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from market.demo import demo_market_seed, demo_orders_seed
    from market.models import Tier
    from telemetry.models import Node
    from telemetry.services import node_register
    from tenants.budgets import budget_set
    from tenants.ledger import MILLI, credits_grant
    from tenants.models import Budget, Tenant
    from tenants.services import member_add, tenant_create

    User = get_user_model()
    admin = User.objects.filter(username=ADMIN[0]).first()
    if admin is None:
        admin = User.objects.create_superuser(username=ADMIN[0], password=ADMIN[1], email="")
    demo_market_seed(actor=admin)
    for name, weight, start_credits, members in TENANTS:
        tenant = Tenant.objects.filter(name=name).first()
        if tenant is None:
            with transaction.atomic():
                tenant = tenant_create(name=name, weight=weight, actor=admin)
                credits_grant(
                    tenant=tenant,
                    amount=start_credits * MILLI,
                    reason="demo starting credits",
                    actor=admin,
                )
        window, mode, cap = BUDGETS[name]
        if not Budget.objects.filter(tenant=tenant, window=window, active=True).exists():
            budget_set(tenant=tenant, window=window, mode=mode, cap=cap, actor=admin)
        for username, role in members:
            if not User.objects.filter(username=username).exists():
                member_add(
                    tenant=tenant, username=username, role=role, actor=admin, password=DEMO_PASSWORD
                )
    demo_orders_seed()
    token_file = var / "demo-node-tokens.json"
    saved = json.loads(token_file.read_text()) if token_file.exists() else {}
    tokens = {}
    for node_name, tier_slug, _gpus in demo_nodes(var):
        if Node.objects.filter(name=node_name).exists():
            if node_name not in saved:
                raise SystemExit(
                    f"node {node_name} exists but its token is not in {token_file}; "
                    f"remove {var} to start the demo afresh"
                )
            tokens[node_name] = saved[node_name]
            continue
        _node, tokens[node_name] = node_register(
            name=node_name, tier=Tier.objects.get(slug=tier_slug), actor=admin
        )
    token_file.write_text(json.dumps(tokens))
    token_file.chmod(0o600)
    return tokens


@dataclass
class Jobs:
    """The demo's simulated jobs: at most one live process per (order, node), as
    `gpumarket run --order` keeps one. An order that wins the next round on the same GPUs
    keeps its process (the enforcement loop suspends it in a lost round and resumes it on a
    win); only a process that has exited, or was terminated, is started again. Work on a
    hand-placed bid's allocation is started once per (allocation, node)."""

    spawn: Callable[..., subprocess.Popen]
    procs: dict[tuple[str, int, str], subprocess.Popen] = field(default_factory=dict)

    def needs(self, key: tuple[str, int, str]) -> bool:
        """Whether ``key`` (kind "order" or "allocation", its id, node) needs a job started:
        it has none live, and, for a hand-placed bid's allocation, none has run yet."""
        proc = self.procs.get(key)
        if proc is None:
            return True
        return key[0] == "order" and proc.poll() is not None

    def start(self, key: tuple[str, int, str], extra_env: dict[str, str]) -> None:
        self.procs[key] = self.spawn(key[2], None, duty=0.3, extra_env=extra_env)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()


def _jobs_start(jobs: Jobs, *, now: datetime) -> None:
    """Start the job each active, placed allocation needs on each of its nodes, with the
    launch environment the API hands `gpumarket run` (the same service)."""
    from market.errors import MarketError
    from market.models import Allocation
    from market.services.launch import allocation_launch, placement_by_node

    for allocation in (
        Allocation.objects.filter(
            status=Allocation.Status.ACTIVE, starts_at__lte=now, ends_at__gt=now
        )
        .select_related("tier", "bid")
        .order_by("pk")
    ):
        order_id = allocation.bid.order_id
        for node in placement_by_node(allocation):
            key = ("order", order_id, node) if order_id else ("allocation", allocation.pk, node)
            if not jobs.needs(key):
                continue
            try:
                launch = allocation_launch(allocation=allocation, node=node, now=now)
            except MarketError as exc:
                logger.info("no job on %s for allocation %s: %s", node, allocation.pk, exc)
                continue
            jobs.start(key, launch.env)


def _work_loop(stop: threading.Event, jobs: Jobs, interval: float) -> None:
    from django.db import close_old_connections
    from django.utils import timezone

    while not stop.wait(interval):
        close_old_connections()
        try:
            _jobs_start(jobs, now=timezone.now())
        except Exception:  # noqa: BLE001 - the demo's job starter must not take the server down
            logger.exception("demo job start failed")


def round_news(told: dict[int, str], active: dict[str, int]) -> list[str]:
    """Console lines for what changed since ``told`` ({round id: status told}, updated): a
    round opened, settled, failed or was voided, and the active policy changing (a guardrail
    rolls a version back). ``active`` holds the policy version last told ({"pk": id})."""
    from market.models import Bid, PolicyVersion, Round
    from tenants.ledger import credits

    lines = []
    for rnd in Round.objects.order_by("pk"):
        if told.get(rnd.pk) == rnd.status:
            continue
        told[rnd.pk] = rnd.status
        if rnd.status == Round.Status.OPEN:
            lines.append(
                f"round {rnd.pk}: open for bids until {rnd.closes_at:%H:%M:%S} UTC "
                f"(window {rnd.starts_at:%H:%M}-{rnd.ends_at:%H:%M})"
            )
        elif rnd.status in (Round.Status.SETTLED, Round.Status.FAILED):
            bids = Bid.objects.filter(round=rnd)
            won = bids.filter(status=Bid.Status.WON).count()
            prices = ", ".join(
                f"{slug} {credits(int(p))}" for slug, p in sorted((rnd.prices or {}).items())
            )
            lines.append(
                f"round {rnd.pk}: {rnd.get_status_display().lower()}, "
                f"{won} of {bids.count()} bids won"
                + (f", prices {prices} credits/GPU-h" if prices else "")
                + (f" ({rnd.failure_reason})" if rnd.failure_reason else "")
            )
        elif rnd.status == Round.Status.VOIDED:
            why = rnd.failure_reason.removeprefix("voided: ")
            lines.append(
                f"round {rnd.pk}: voided, its charges refunded and its allocations revoked"
                + (f" ({why})" if why else "")
            )
    policy = PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE).first()
    if policy is not None and active.get("pk") != policy.pk:
        if "pk" in active:
            lines.append(
                f"policy v{policy.number} is active now"
                + (f": {policy.note}" if policy.note else "")
            )
        active["pk"] = policy.pk
    return lines


def _round_lines(stop: threading.Event, interval: float = 2.0) -> None:
    """Print one line when a round opens, settles, fails or is voided, and when the active
    policy changes."""
    from market.models import Round

    # Rounds already over when the demo starts (a restart) are not told again.
    told: dict[int, str] = {
        pk: status
        for pk, status in Round.objects.exclude(status=Round.Status.OPEN).values_list(
            "pk", "status"
        )
    }
    active: dict[str, int] = {}  # the policy in force at the start is not news
    while not stop.wait(interval):
        try:
            for line in round_news(told, active):
                print(line, flush=True)
        except Exception:  # noqa: BLE001 - the console lines must not take the demo down
            logger.exception("demo round report failed")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpumarket demo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--no-jobs", action="store_true", help="do not start simulated jobs on allocations"
    )
    args = parser.parse_args(argv)

    _environment_set()
    var = _platform_ready()
    tokens = _seed(var)

    from django.core.management import call_command

    from telemetry.agent.simulated_backend import spawn_simulated_work

    def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
        # `kill` or a supervisor's SIGTERM stops the demo like Ctrl-C: children cleaned up.
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)

    server = f"http://127.0.0.1:{args.port}"
    log_dir = var / "logs"
    log_dir.mkdir(exist_ok=True)
    children = Children(log_dir=log_dir, env=dict(os.environ))
    nodes = demo_nodes(var)
    _processes_start(children, var=var, server=server, nodes=nodes, tokens=tokens)
    # Work with no allocation behind it: the enforcement loop pauses it within a few ticks.
    work = [spawn_simulated_work(nodes[1][0], 3, duty=0.4)]
    stop = threading.Event()
    jobs = Jobs(spawn=spawn_simulated_work)
    if not args.no_jobs:
        threading.Thread(target=_work_loop, args=(stop, jobs, 5.0), daemon=True).start()

    threading.Thread(target=_round_lines, args=(stop,), daemon=True).start()
    threading.Thread(target=_supervise, args=(stop, children), daemon=True).start()
    print(_welcome(server=server, log_dir=log_dir), flush=True)
    try:
        call_command("runserver", f"127.0.0.1:{args.port}", use_reloader=False)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for proc in work:
            proc.terminate()
        jobs.stop()
        children.stop()
    return 0


def _environment_set() -> None:
    """The demo's settings: development mode, and short periods so a visitor sees rounds
    clear and enforcement act within minutes. The console shows the logins and a line per
    round; every request the server answers (the agents post every few seconds) goes to
    logs/web.log instead (config/settings.py)."""
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("GPUMARKET_ROUND_TICK_SECONDS", "5")
    os.environ.setdefault("GPUMARKET_ENFORCE_SECONDS", "5")
    os.environ.setdefault("GPUMARKET_PREEMPT_GRACE_SECONDS", "10")
    var_dir = Path(
        os.environ.get("GPUMARKET_VAR_DIR", Path(__file__).resolve().parent.parent / "var")
    )
    (var_dir / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GPUMARKET_WEB_LOG", str(var_dir / "logs" / "web.log"))
    # One cache for the web and the worker (config/settings.py): files under var/.
    os.environ.setdefault("GPUMARKET_CACHE_DIR", str(var_dir / "cache"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo: %(message)s")


def _platform_ready() -> Path:
    """Django set up, the database migrated; the var directory it keeps its files in."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    # The console is for people: HiGHS's banner (printed on fd 1 the first time the web
    # process solves, e.g. a bid's foresight) and kombu's "could not be delivered" warning
    # (the first task sent before the worker declared its queue, which kombu then declares
    # and delivers to) say nothing a visitor can act on.
    from kombu.transport.virtual.base import UndeliverableWarning

    from market.clearing.solvers.highs import banner_silence

    warnings.filterwarnings("ignore", category=UndeliverableWarning)
    banner_silence()
    var = Path(settings.VAR_DIR)
    var.mkdir(parents=True, exist_ok=True)
    call_command("migrate", interactive=False, verbosity=0)
    return var


def _processes_start(
    children: Children,
    *,
    var: Path,
    server: str,
    nodes: tuple[tuple[str, str, int], ...],
    tokens: dict[str, str],
) -> None:
    """The worker (with beat embedded) and one simulated agent per node."""
    children.start(
        "worker",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--beat",
            "--pool",
            "solo",
            "-Q",
            "clearing,telemetry,default",
            "--loglevel",
            "INFO",
            "--schedule",
            str(var / "celerybeat-schedule"),
        ],
    )
    for node_name, _tier, gpus in nodes:
        children.start(
            f"agent-{node_name}",
            [
                sys.executable,
                "-m",
                "gpumarket",
                "agent",
                "--server",
                server,
                "--backend",
                "simulated",
                "--node-name",
                node_name,
                "--sim-gpus",
                str(gpus),
                "--interval",
                "3",
            ],
            {"GPUMARKET_NODE_TOKEN": tokens[node_name]},
        )


def _welcome(*, server: str, log_dir: Path) -> str:
    return (
        "\ngpumarket demo (SIMULATED nodes; no GPU is used)\n"
        f"  site:    {server}\n"
        f"  admin:   {ADMIN[0]} / {ADMIN[1]}  (platform admin)\n"
        + "".join(
            f"  {u:<8} / {DEMO_PASSWORD}  ({role}, {name})\n"
            for name, _w, _c, members in TENANTS
            for u, role in members
        )
        + f"  logs:    {log_dir}\n  Ctrl-C stops everything.\n"
    )
