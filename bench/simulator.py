"""Simulator figures for docs/simulator.md (not a test): every mechanism and baseline on the
two Gavel traces, with the goals checked, as Markdown.

    .venv/bin/python bench/simulator.py                 # both traces, every policy
    .venv/bin/python bench/simulator.py --only gavel    # just the first configuration
    .venv/bin/python bench/simulator.py --max-jobs 400  # a shorter dense run
    .venv/bin/python bench/simulator.py --restart-seconds 60 --max-jobs 300  # with restarts

Each configuration is one ``gpumarket simulate ... --format markdown`` command, printed with
its output, so a figure in the doc can be rerun on its own.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel"
CONFIGURATIONS = {
    # The setting of Gavel's own figures: first 120 jobs, 8 GPUs of each type, 6-minute rounds.
    "gavel": [
        "--trace", str(DATA / "msr_seed0_2869ce.trace"),
        "--max-jobs", "120",
        "--tiers", "k80=8,p100=8,v100=8",
    ],
    # The dense trace on a 32-GPU cluster (its largest gang is 8 GPUs).
    "dense": [
        "--trace", str(DATA / "msr_seed0_0e4a51.trace"),
        "--tiers", "k80=8,p100=8,v100=16",
    ],
}  # fmt: skip
COMMON = ["--tenants", "jobs", "--round-minutes", "6", "--format", "markdown"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CONFIGURATIONS), default=None)
    parser.add_argument("--max-jobs", type=int, default=None, help="cap the dense trace")
    parser.add_argument("--policy", default=None, help="comma-separated (default: all)")
    parser.add_argument(
        "--restart-seconds", type=int, default=0, help="work lost per preemption (default 0)"
    )
    args = parser.parse_args()
    env = {**os.environ, "DEBUG": os.environ.get("DEBUG", "1")}
    for name, trace_args in CONFIGURATIONS.items():
        if args.only and name != args.only:
            continue
        extra = list(COMMON)
        if args.max_jobs and name == "dense":
            extra += ["--max-jobs", str(args.max_jobs)]
        if args.policy:
            extra += ["--policy", args.policy]
        out = Path("var") / "simulations" / f"bench-{name}"
        if args.restart_seconds:
            extra += ["--restart-seconds", str(args.restart_seconds)]
            out = out.with_name(f"{out.name}-restart{args.restart_seconds}")
        command = [sys.executable, "-m", "gpumarket", "simulate", *trace_args, *extra]
        command += ["--out", str(out)]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        sys.stdout.write(f"## {name}\n\n{done.stdout}\n")
        sys.stdout.write(f"Wall time of the command: {time.perf_counter() - started:.0f} s\n\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
