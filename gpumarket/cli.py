"""The ``gpumarket`` command.

``clear`` and ``agent`` need no Django (a node agent runs without the platform's settings);
every other subcommand is a Django management command, with hyphens for underscores:
``gpumarket verify-ledger`` runs ``manage.py verify_ledger``.
"""

from __future__ import annotations

import os
import sys

USAGE = """usage: gpumarket COMMAND [ARGS]

  demo            run the whole platform on the embedded default (SQLite, embedded broker,
                  a worker, beat and two simulated nodes) at http://127.0.0.1:8000
  agent           run a node agent (NVML or simulated) that posts samples and applies directives
  run --allocation N -- COMMAND
                  start COMMAND on the GPUs placed for allocation N on this node, with
                  CUDA_VISIBLE_DEVICES and its launch token set
  run --order N [-- COMMAND]
                  the same on the GPUs standing order N holds on this node now (its own
                  command when none is given)
  order ACTION    standing orders: create, list, show, edit, pause, resume, cancel
                  (`gpumarket order --help`)
  clear FILE      clear an auction instance (JSON) and print the result as JSON
  simulate        replay a job trace or past rounds under a policy (what-if)
  forecast --history HISTORY.csv --horizon HOURS --out FORECAST.csv
                  forecast hourly GPU-hours per tier (P10/P50/P90) from a CSV history, with
                  the model planning picks by backtest
  plan FILE       run a capacity scenario (tier changes, options to buy or rent) and print
                  the forecast, the replay and the recommendation as JSON
  verify-ledger   check every ledger invariant; non-zero exit names what is wrong
  verify-audit    check the keyed audit chain and its signed checkpoints; non-zero exit
                  names the first bad event
  audit-checkpoint
                  append a signed checkpoint of the audit log's head (beat does it each minute)
  ...             any other manage.py command (migrate, createsuperuser, shell, ...)
"""


def _pure(command: str, argv: list[str]) -> int | None:
    if command == "clear":
        from market.clearing.instance.cli import main as clear_main

        return clear_main(argv)
    if command == "demo":
        from gpumarket.demo import main as demo_main

        return demo_main(argv)
    if command == "forecast":
        from gpumarket.forecast_cli import main as forecast_main

        return forecast_main(argv)
    if command == "order":
        from gpumarket.order_cli import main as order_main

        return order_main(argv)
    if command == "run":
        from gpumarket.run import main as run_main

        return run_main(argv)
    if command == "agent":
        from telemetry.agent import main as agent_main

        return agent_main(argv)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        sys.stdout.write(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    code = _pure(command, rest)
    if code is not None:
        return code
    if "DATABASE_URL" not in os.environ and "SECRET_KEY" not in os.environ:
        # The embedded default (the demo's SQLite under var/): development settings, so that
        # `gpumarket verify-ledger` and friends work on it without further configuration.
        os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gpumarket", command.replace("-", "_"), *rest])
    return 0


if __name__ == "__main__":
    sys.exit(main())
