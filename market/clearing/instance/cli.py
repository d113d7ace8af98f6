"""``gpumarket clear INSTANCE.json [--policy NAME] [--divisible]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from market.clearing import clear
from market.clearing.errors import ClearingError, SolverError
from market.clearing.instance.io import instance_from_json, read_instance_file
from market.clearing.mechanisms.registry import MECHANISMS
from market.clearing.solvers.highs import banner_silence


def main(argv: Sequence[str] | None = None) -> int:
    """Clear the instance file and print the result JSON. Exit codes: 0 done, 2 bad input
    (message on stderr), 1 the solver could not give a proven result."""
    parser = argparse.ArgumentParser(prog="gpumarket clear", description=__doc__)
    parser.add_argument("instance", help="path to the instance JSON")
    parser.add_argument("--policy", choices=sorted(MECHANISMS), help="overrides policy.name")
    parser.add_argument("--divisible", action="store_true", help="fractional GPU-hours")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has already printed the usage message
        return int(exc.code or 0)
    try:
        data = read_instance_file(args.instance)
    except OSError as exc:
        print(f"gpumarket clear: cannot read {args.instance}: {exc.strerror}", file=sys.stderr)
        return 2
    except ClearingError as exc:
        print(f"gpumarket clear: {exc}", file=sys.stderr)
        return 2
    banner_silence()  # standard output is the result: JSON only
    try:
        instance, policy, params = instance_from_json(data)
        if args.policy and args.policy != policy:
            params = None  # the file's params belong to the file's policy
            policy = args.policy
        result = clear(instance, mechanism=policy, params=params, divisible=args.divisible)
    except SolverError as exc:
        print(f"gpumarket clear: {exc}", file=sys.stderr)
        return 1
    except ClearingError as exc:
        print(f"gpumarket clear: {exc}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`gpumarket clear x.json | head`): not an error. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
