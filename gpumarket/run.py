"""``gpumarket run --allocation N -- COMMAND``: start COMMAND on the GPUs placed for
allocation N on this node.

Asks the API for the launch (the allocation must be active, the token's team's, and placed on
this node), then replaces itself with COMMAND, its environment carrying CUDA_VISIBLE_DEVICES,
GPUMARKET_ALLOCATION and GPUMARKET_LAUNCH_TOKEN. Being replaced (not a parent waiting on a
child) means the node agent sees, pauses and resumes the command itself. Needs no Django.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpumarket.client import ApiError, Client, this_node

USAGE_EXAMPLE = "gpumarket run --allocation 65 -- python train.py"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket run",
        description="Start a command on the GPUs placed for an allocation on this node.",
        epilog=f"example: {USAGE_EXAMPLE}",
    )
    parser.add_argument("--allocation", type=int, required=True, help="the allocation's id")
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
    if not command and not args.print_env:
        parser.error(f"give the command after --, e.g. {USAGE_EXAMPLE}")
    if not args.token:
        parser.error("give --token or set GPUMARKET_TOKEN (create one on the API tokens page)")
    node = args.node or this_node()
    try:
        launch = Client(args.url, token=args.token).launch(args.allocation, node=node)
    except ValueError as exc:
        parser.error(str(exc))
    except ApiError as exc:
        if exc.status == 404:
            why = f"allocation {args.allocation} is not one of your team's allocations"
        else:
            why = exc.message
        sys.stderr.write(f"gpumarket run: refused: {why}\n")
        return 2
    if args.print_env:
        for key, value in sorted(launch["env"].items()):
            sys.stdout.write(f"{key}={value}\n")
        return 0
    sys.stderr.write(
        f"gpumarket run: allocation {args.allocation} on {node}, GPUs "
        f"{launch['env']['CUDA_VISIBLE_DEVICES']}\n"
    )
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, {**os.environ, **launch["env"]})
    except OSError as exc:
        sys.stderr.write(f"gpumarket run: cannot start {command[0]!r}: {exc}\n")
        return 127
    return 0  # not reached: exec replaced this process
