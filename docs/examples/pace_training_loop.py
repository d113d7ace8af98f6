"""A training loop that asks gpumarket how hard it may push, and adapts.

    GPUMARKET_URL=http://127.0.0.1:8000 GPUMARKET_TOKEN=gm_... \
        python docs/examples/pace_training_loop.py --steps 50

(with the project installed, ``pip install -e .``; from a bare checkout, prefix PYTHONPATH=.)

Each step reads the pace mode (the helper asks the server at most once per --min-interval
seconds, so asking every step is free) and picks the step's settings from it: longer
sequences and heavier augmentation only when the mode allows. The "training" here is a toy
computation so the example runs anywhere; replace ``train_step`` with your own.

The allocation comes from --allocation, else GPUMARKET_ALLOCATION (the variable the node
agent uses to tag the job's processes), else the newest active allocation of your team.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

from gpumarket.client import ApiError, Client

# What each mode buys. Keep "light" safe for a GPU that is already full.
SETTINGS = {
    "light": {"seq_len": 512, "augment": "none"},
    "moderate": {"seq_len": 1024, "augment": "flip+crop"},
    "heavy": {"seq_len": 2048, "augment": "flip+crop+mixup"},
}


def train_step(*, seq_len: int, augment: str) -> float:
    """Stand-in for one optimiser step: work proportional to the sequence length."""
    total = 0.0
    for i in range(seq_len * (2 if "mixup" in augment else 1)):
        total += (i % 7) * 1e-3
    return total / seq_len


def pick_allocation(client: Client, given: int | None) -> int:
    if given is not None:
        return given
    env = os.environ.get("GPUMARKET_ALLOCATION")
    if env:
        return int(env)
    active = client.allocations(status="active")
    if not active:
        raise SystemExit("no active allocation: pass --allocation or set GPUMARKET_ALLOCATION")
    return active[0]["id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("GPUMARKET_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("GPUMARKET_TOKEN", ""))
    parser.add_argument("--allocation", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.5, help="pause between steps")
    parser.add_argument(
        "--min-interval", type=float, default=30.0, help="seconds between pace polls"
    )
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("give --token or set GPUMARKET_TOKEN (create one on the API tokens page)")

    client = Client(args.url, args.token)
    try:
        allocation = pick_allocation(client, args.allocation)
    except ApiError as exc:
        print(f"cannot list allocations: {exc}", file=sys.stderr)
        return 1
    pace = client.pace(allocation, min_interval=args.min_interval)
    modes: Counter[str] = Counter()
    for step in range(1, args.steps + 1):
        mode = pace.mode()
        modes[mode] += 1
        settings = SETTINGS[mode]
        loss = train_step(**settings)
        why = (
            "; ".join(pace.reading["reasons"])
            if pace.reading
            else f"no answer yet ({pace.last_error})"
        )
        print(
            f"step {step:4d}  mode={mode:<8} seq_len={settings['seq_len']:<5} "
            f"augment={settings['augment']:<16} loss={loss:.4f}  [{why}]",
            flush=True,
        )
        if args.step_seconds:
            time.sleep(args.step_seconds)
    summary = ", ".join(f"{m}: {modes[m]}" for m in SETTINGS)
    print(f"allocation {allocation}: {args.steps} steps ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
