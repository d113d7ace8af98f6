"""What idle reclaim and backfill buy on the job traces (not a test): each configuration is
simulated with neither and with both, under the platform's rules (market/spare.py), and the
utilisation (GPU-hours used / GPU-hours offered) and job completion times are printed as a
Markdown table for docs/capacity.md.

    .venv/bin/python bench/simulator_spare.py                       # light trace, 120 jobs
    .venv/bin/python bench/simulator_spare.py --trace dense --max-jobs 300 --policy welfare

Traces carry no utilisation, so a job computes ``--utilisation`` of the GPU-time it holds
(each value of the list is one configuration), its idle stretch at the end of the window
("end") or in the middle ("middle": its owner comes back and finds the GPU reclaimed).
The policy: every type reclaimed after 15 idle minutes and a 5-minute grace, half the
unused time refunded; sub-rounds every 5 minutes; one-hour windows, one tenant per job.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "gavel"
TRACES = {
    "light": ("msr_seed0_2869ce.trace", {"k80": 8, "p100": 8, "v100": 8}),
    "dense": ("msr_seed0_0e4a51.trace", {"k80": 8, "p100": 8, "v100": 16}),
}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from market.simulator import SimConfig, simulate, summarise, throughputs_load, trace_load
    from market.spare import IdlePolicy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", choices=sorted(TRACES), default="light")
    parser.add_argument("--max-jobs", type=int, default=120)
    parser.add_argument("--policy", default="welfare,maxmin", help="comma-separated")
    parser.add_argument("--utilisation", default="1.0:end,0.5:end,0.5:middle")
    parser.add_argument("--round-minutes", type=float, default=60.0)
    args = parser.parse_args()
    name, tiers = TRACES[args.trace]
    jobs = trace_load(
        DATA / name,
        throughputs=throughputs_load(DATA / "simulation_throughputs.json"),
        gpu_types=list(tiers),
        tenants="jobs",
        max_jobs=args.max_jobs,
    )
    policy = IdlePolicy(below_pct=5, idle_minutes=15, grace_minutes=5, refund_pct=50)
    print(
        f"{len(jobs)} jobs of {name}, tiers {tiers}, {args.round_minutes:g}-minute windows, "
        f"one tenant per job. Machine: {platform.machine()}, Python {platform.python_version()}."
    )
    print()
    head = (
        "| utilisation | policy | reclaim + backfill | GPU utilisation | mean JCT (h) "
        "| p95 JCT (h) | makespan (h) | GPUs reclaimed | GPUs backfilled "
        "| busy GPU-h on backfill | wall (s) |"
    )
    print(head)
    print("|" + "---|" * head.count(" | ") + "---|")
    for setting in args.utilisation.split(","):
        share, stretch = setting.split(":")
        for mechanism in args.policy.split(","):
            for spare in (False, True):
                config = SimConfig(
                    tiers=tiers,
                    tenants=len(jobs),
                    round_minutes=args.round_minutes,
                    utilisation=float(share),
                    idle_stretch=stretch,  # type: ignore[arg-type]
                    idle_reclaim=policy if spare else None,
                    backfill_minutes=5 if spare else None,
                )
                started = time.perf_counter()
                result = simulate(jobs, policy=mechanism, config=config)
                wall = time.perf_counter() - started
                s = summarise(result)
                backfill_h = sum(r.backfill_busy_gpu_seconds for r in result.rounds) / 3600
                print(
                    f"| {share} {stretch} | {mechanism} | {'yes' if spare else 'no'} "
                    f"| {s.utilisation:.3f} | {s.jct_mean_h:.2f} | {s.jct_p95_h:.2f} "
                    f"| {s.makespan_h:.1f} | {sum(r.reclaimed_gpus for r in result.rounds)} "
                    f"| {sum(r.backfill_gpus for r in result.rounds)} | {backfill_h:.0f} "
                    f"| {wall:.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
