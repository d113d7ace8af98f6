"""``gpumarket order ...`` (standing orders through the API) and ``gpumarket run --order N``.

Money is typed and shown in credits, work in GPU-hours. Needs no Django: it talks to the
platform with the user's API token (GPUMARKET_TOKEN) like ``gpumarket run --allocation``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from gpumarket.client import ApiError, Client

ORDER_EXAMPLE = (
    "gpumarket order create --name sweep --value a100=2.5 --gpus 4 --gpu-hours 200 --ceiling 600"
)
RUN_EXAMPLE = "gpumarket run --order 12 -- python train.py"


def _connection(parser: argparse.ArgumentParser) -> None:
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


def _values(pairs: list[str] | None, parser: argparse.ArgumentParser) -> dict[str, str] | None:
    if not pairs:
        return None
    values = {}
    for pair in pairs:
        slug, sep, price = pair.partition("=")
        if not sep or not slug or not price:
            parser.error(f"--value takes TIER=CREDITS, e.g. a100=2.5; got {pair!r}")
        values[slug.strip()] = price.strip()
    return values


def _terms(sub: argparse.ArgumentParser, *, editing: bool) -> None:
    sub.add_argument("--name", required=not editing, help="e.g. the run it drives")
    sub.add_argument(
        "--value",
        action="append",
        metavar="TIER=CREDITS",
        required=not editing,
        help="the most it pays per GPU-hour on a tier, e.g. a100=2.5 (repeat for more tiers; "
        "a tier left out is not acceptable)",
    )
    sub.add_argument("--gpus", type=int, required=not editing, help="GPUs asked each round")
    sub.add_argument(
        "--min-gpus",
        type=int,
        help="all or nothing below this many (default: all of them; 1 = any number helps)",
    )
    sub.add_argument("--gpu-hours", type=float, help="GPU-hours wanted in all")
    sub.add_argument("--ceiling", required=not editing, help="the most it may spend, credits")
    sub.add_argument("--deadline", help="ISO 8601, e.g. 2030-01-09T18:00Z: it stops bidding then")
    sub.add_argument(
        "--restart-minutes",
        type=int,
        default=None if editing else 5,
        help="work lost each time it is stopped or moved (default 5)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket order",
        description="Standing orders: bid every round for GPU-hours until done, out of the "
        "spend ceiling or past the deadline. Money in credits, work in GPU-hours.",
        epilog=f"example: {ORDER_EXAMPLE}\nthen:    {RUN_EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection(parser)
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    subs = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = subs.add_parser("create", help="create an order (it bids from the open round on)")
    _terms(create, editing=False)
    create.add_argument("--campaign", type=int, help="a campaign id to count its spend against")
    create.add_argument("--command", default="", help="what `gpumarket run --order` starts")
    create.add_argument("--slurm-job", default="", help="or the Slurm job it drives")
    create.add_argument(
        "--preemptible",
        action="store_true",
        help="also take GPUs backfilled within a window (suspended when the window ends)",
    )
    listing = subs.add_parser("list", help="the team's orders")
    listing.add_argument("--status", help="active, paused, done, cancelled, exhausted, expired")
    show = subs.add_parser("show", help="one order: progress, rounds, ETA")
    show.add_argument("order", type=int)
    edit = subs.add_parser("edit", help="change a live order (left out: unchanged)")
    edit.add_argument("order", type=int)
    _terms(edit, editing=True)
    edit.add_argument("--until-cancelled", action="store_true", help="no GPU-hours target")
    edit.add_argument("--no-deadline", action="store_true", help="remove the deadline")
    for verb, text in (
        ("pause", "stop bidding (work it won runs to the end of its window)"),
        ("resume", "bid again from the open round"),
        ("cancel", "end the order: no more bids"),
    ):
        subs.add_parser(verb, help=text).add_argument("order", type=int)
    return parser


def _hours(value: float | None) -> str:
    return "until cancelled" if value is None else f"{value:g}"


def _line(order: dict) -> str:
    sight = order.get("foresight") or {}
    eta = sight.get("eta") or f"unknown ({sight.get('eta_reason', '')})"
    values = ", ".join(f"{slug} {price}" for slug, price in order["values"].items())
    return (
        f"#{order['id']} {order['name']} [{order['status']}] "
        f"{order['gpu_hours']:g}/{_hours(order['gpu_hours_wanted'])} GPU-h, "
        f"spent {order['spent']}/{order['ceiling']} credits, values {values} credits/GPU-h, "
        f"preemptions {order['preemptions']}, ETA {eta}"
    )


def _show(order: dict) -> str:
    sight = order.get("foresight") or {}
    lines = [_line(order)]
    for label, key in (("status", "status_reason"), ("no bid", "hold_reason")):
        if order.get(key):
            lines.append(f"  {label}: {order[key]}")
    lines.append(f"  rounds won {order['rounds_won']}, lost {order['rounds_lost']}")
    if sight.get("win_rate") is not None:
        lines.append(
            f"  would have won {sight['win_rate']:.0%} of the last {sight['rounds']} rounds"
        )
    if order.get("deadline"):
        if sight.get("needed_value") is not None:
            lines.append(
                f"  bid {sight['needed_value']} credits/GPU-h to finish by {order['deadline']}"
            )
        elif sight.get("needed_reason"):
            lines.append(f"  deadline {order['deadline']}: {sight['needed_reason']}")
    if order.get("command"):
        lines.append(f"  run: gpumarket run --order {order['id']} -- {order['command']}")
    return "\n".join(lines)


def _act(client: Client, args: argparse.Namespace, parser) -> Any:
    if args.action == "create":
        return client.create_order(
            name=args.name,
            values=_values(args.value, parser),
            gpus=args.gpus,
            min_gpus=args.min_gpus,
            gpu_hours=args.gpu_hours,
            ceiling=args.ceiling,
            deadline=args.deadline,
            restart_minutes=args.restart_minutes,
            campaign=args.campaign,
            command=args.command,
            slurm_job=args.slurm_job,
            preemptible=args.preemptible,
        )
    if args.action == "list":
        return client.orders(status=args.status)
    if args.action == "show":
        return client.order(args.order)
    if args.action == "edit":
        changes: dict[str, Any] = {
            "name": args.name,
            "values": _values(args.value, parser),
            "gpus": args.gpus,
            "min_gpus": args.min_gpus,
            "ceiling": args.ceiling,
            "restart_minutes": args.restart_minutes,
        }
        if args.until_cancelled or args.gpu_hours is not None:
            changes["gpu_hours"] = None if args.until_cancelled else args.gpu_hours
        if args.no_deadline or args.deadline:
            changes["deadline"] = None if args.no_deadline else args.deadline
        return client.edit_order(args.order, **changes)
    verbs: dict[str, Callable[[int], dict]] = {
        "pause": client.pause_order,
        "resume": client.resume_order,
        "cancel": client.cancel_order,
    }
    return verbs[args.action](args.order)


def _refused(prog: str, exc: ApiError) -> int:
    sys.stderr.write(f"{prog}: refused: {exc.message}\n")
    for field, messages in sorted(exc.fields.items()):
        for message in messages:
            sys.stderr.write(f"  {field}: {message}\n")
    return 2


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("give --token or set GPUMARKET_TOKEN (create one on the API tokens page)")
    try:
        client = Client(args.url, token=args.token)
        result = _act(client, args, parser)
    except ValueError as exc:
        parser.error(str(exc))
    except ApiError as exc:
        return _refused("gpumarket order", exc)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif isinstance(result, list):
        sys.stdout.write("".join(_line(o) + "\n" for o in result) or "no orders\n")
    else:
        sys.stdout.write(_show(result) + "\n")
    return 0
