"""``gpumarket run --allocation N -- COMMAND`` or ``gpumarket run --order N [-- COMMAND]``:
start COMMAND on the GPUs placed for allocation N on this node, or on those standing order N
holds on this node now (the order's own command when none is given).

Asks the API for the launch (the allocation must be active, the token's team's, and placed on
this node), then replaces itself with COMMAND, its environment carrying CUDA_VISIBLE_DEVICES,
GPUMARKET_ALLOCATION and GPUMARKET_LAUNCH_TOKEN. Being replaced (not a parent waiting on a
child) means the node agent sees, pauses and resumes the command itself. Needs no Django.

With ``--order N --follow`` it stays, and keeps the order's work going on this node: it
starts COMMAND (in its own session, so the agent's signals reach the work and not this
process) wherever the order holds GPUs here, waits while it runs or is suspended, and when it
was stopped because the order moved to other GPUs, starts it again there (the work resumes
from its checkpoint); it ends when the work exits 0 or the order has ended.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

from gpumarket.client import ApiError, Client, this_node

USAGE_EXAMPLE = "gpumarket run --allocation 65 -- python train.py"
ORDER_EXAMPLE = "gpumarket run --order 12 -- python train.py"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket run",
        description="Start a command on the GPUs placed for an allocation on this node, or on "
        "those a standing order holds on this node now (its own command when none is given).",
        epilog=f"examples: {USAGE_EXAMPLE}\n          {ORDER_EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--allocation", type=int, help="the allocation's id")
    which.add_argument("--order", type=int, help="the standing order's id")
    parser.add_argument(
        "--node",
        default=None,
        help="this node's name on the fleet page (default: GPUMARKET_NODE, else "
        "GPUMARKET_SIM_NODE, else the host name)",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("GPUMARKET_URL", "http://127.0.0.1:8000"),
        help="the platform (default: GPUMARKET_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GPUMARKET_TOKEN", ""),
        help="a personal API token, gm_... (default: GPUMARKET_TOKEN)",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="with --order: keep the order's work going on this node, starting it again where "
        "the order holds GPUs whenever it was stopped, until it exits 0 or the order ends",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=10.0,
        help="with --follow: seconds between looks for the order's GPUs (default 10)",
    )
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="print the environment lines (KEY=value) instead of running a command",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not args.print_env and args.order is None:
        parser.error(f"give the command after --, e.g. {USAGE_EXAMPLE}")
    if not args.token:
        parser.error("give --token or set GPUMARKET_TOKEN (create one on the API tokens page)")
    node = args.node or this_node()
    client = Client(args.url, token=args.token)
    if args.follow:
        if args.order is None or args.print_env:
            parser.error("--follow goes with --order, and runs a command (not --print-env)")
        try:
            if not command:
                command = shlex.split(client.order(args.order).get("command") or "")
            if not command:
                parser.error(f"order {args.order} has no command: give one after --")
            return _follow(client, order=args.order, node=node, command=command, poll=args.poll)
        except ApiError as exc:
            sys.stderr.write(f"gpumarket run: refused: {exc.message}\n")
            return 2
    what = f"allocation {args.allocation}"
    try:
        allocation = args.allocation
        if args.order is not None:
            if not command and not args.print_env:
                command = shlex.split(client.order(args.order).get("command") or "")
                if not command:
                    parser.error(
                        f"order {args.order} has no command: give one after --, e.g. "
                        f"{ORDER_EXAMPLE}"
                    )
            what = f"order {args.order}"
            allocation = client.order_allocation(args.order, node=node)["id"]
            what = f"order {args.order}, allocation {allocation}"
        launch = client.launch(allocation, node=node)
    except ValueError as exc:
        parser.error(str(exc))
    except ApiError as exc:
        if exc.status == 404 and "holds no GPUs" not in exc.message:
            kind = "order" if args.order is not None else "allocation"
            number = args.order if args.order is not None else args.allocation
            why = f"{kind} {number} is not one of your team's {kind}s"
        else:
            why = exc.message
        sys.stderr.write(f"gpumarket run: refused: {why}\n")
        return 2
    if args.print_env:
        for key, value in sorted(launch["env"].items()):
            sys.stdout.write(f"{key}={value}\n")
        return 0
    sys.stderr.write(
        f"gpumarket run: {what} on {node}, GPUs {launch['env']['CUDA_VISIBLE_DEVICES']}\n"
    )
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, {**os.environ, **launch["env"]})
    except OSError as exc:
        sys.stderr.write(f"gpumarket run: cannot start {command[0]!r}: {exc}\n")
        return 127
    return 0  # not reached: exec replaced this process


LIVE = ("active", "paused")


def _say(text: str) -> None:
    sys.stderr.write(f"gpumarket run: {text}\n")
    sys.stderr.flush()


def _follow(client: Client, *, order: int, node: str, command: list[str], poll: float) -> int:
    """Start ``command`` wherever the order holds GPUs on ``node``, again after each stop,
    until it exits 0 or the order ends (module docstring)."""
    child: subprocess.Popen | None = None

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            os.killpg(child.pid, signal.SIGCONT)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            allocation = client.order_allocation(order, node=node)
        except ApiError as exc:
            if exc.status != 404:
                raise
            status = client.order(order)["status"]
            if status not in LIVE:
                _say(f"order {order} is {status}; nothing more to run here")
                return 0
            time.sleep(poll)
            continue
        launch = client.launch(allocation["id"], node=node)
        child = subprocess.Popen(
            command, env={**os.environ, **launch["env"]}, start_new_session=True
        )
        _say(
            f"order {order}: started pid {child.pid} on allocation {allocation['id']}, {node} "
            f"GPUs {launch['env']['CUDA_VISIBLE_DEVICES']}"
        )
        code = child.wait()
        if code == 0:
            _say(
                f"order {order}: the work exited 0; done here (`gpumarket order cancel {order}` "
                "ends the order)"
            )
            return 0
        _say(f"order {order}: pid {child.pid} ended ({code}); looking for the order's GPUs again")
        time.sleep(poll)
