"""`gpumarket agent`: parse the command line, build backend, executor and loop, run."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

from telemetry.agent.backends import BACKENDS, BackendOptions, backend_build
from telemetry.agent.errors import AgentError
from telemetry.agent.executors import EXECUTORS, executor_build
from telemetry.agent.loop import AgentLoop
from telemetry.agent.mapping import MAPPINGS, mapper_build
from telemetry.agent.transport import IngestClient

logger = logging.getLogger(__name__)

TOKEN_ENV = "GPUMARKET_NODE_TOKEN"

EXIT_OK = 0
EXIT_UNDELIVERED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
        return value

    return parse


def _mapping_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("none",):
        return ()
    unknown = [name for name in names if name not in MAPPINGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected 'none' or a comma-separated list of {', '.join(sorted(MAPPINGS))}, "
            f"not {text!r}"
        )
    return tuple(dict.fromkeys(names))


def mappings_chosen(*, mapping: tuple[str, ...] | None, executor: str) -> tuple[str, ...]:
    """`--map` as given; by default the executor's own workload manager, if it has one."""
    if mapping is not None:
        return mapping
    return (executor,) if executor in MAPPINGS else ()


def parser_build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket agent",
        description="Report this node's GPUs to gpumarket and carry out its directives.",
    )
    parser.add_argument("--server", required=True, help="base URL, e.g. https://gpumarket.example")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"the node's token (default: ${TOKEN_ENV}, which keeps it out of `ps`)",
    )
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="nvml")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default="signal")
    parser.add_argument(
        "--map",
        type=_mapping_names,
        default=None,
        metavar="slurm,kubernetes|none",
        help="where to look up the allocation of work without GPUMARKET_ALLOCATION: the "
        "Slurm job's comment, the pod's label (default: the executor's, else none)",
    )
    parser.add_argument("--interval", type=_positive(float), default=5.0, help="seconds")
    parser.add_argument("--node-name", default=socket.gethostname())
    parser.add_argument(
        "--sim-gpus", type=_positive(int), default=4, help="GPUs of a simulated node"
    )
    parser.add_argument(
        "--sim-nvlink-islands",
        type=_positive(int),
        default=2,
        help="NVLink islands of a simulated node (its GPUs split evenly; default 2)",
    )
    parser.add_argument(
        "--backlog", type=_positive(int), default=1000, help="batches kept while the server is down"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="one iteration (and one more to report the outcome of any directive), then exit",
    )
    parser.add_argument(
        "--timeout", type=_positive(float), default=10.0, help="HTTP timeout, seconds"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser


def main(argv: list[str]) -> int:
    """Run the agent; return the process exit code.

    0: stopped cleanly (with --once: every batch delivered); 1: with --once, a batch could
    not be delivered; 2: bad arguments; 3: the backend or executor cannot work on this host.
    """
    parser = parser_build()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse exits on --help and on errors; the caller wants a code, not an exit.
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    if not args.token:
        logger.error("a node token is needed: --token or $%s", TOKEN_ENV)
        return EXIT_USAGE
    try:
        mapper = mapper_build(names=mappings_chosen(mapping=args.map, executor=args.executor))
        if mapper.sources:
            logger.info(
                "work without GPUMARKET_ALLOCATION is mapped through: %s", ", ".join(mapper.names)
            )
        backend = backend_build(
            name=args.backend,
            options=BackendOptions(
                node_name=args.node_name,
                sim_gpus=args.sim_gpus,
                sim_nvlink_islands=args.sim_nvlink_islands,
                mapper=mapper,
            ),
        )
    except AgentError as exc:
        logger.error("%s", exc)
        return EXIT_UNAVAILABLE
    try:
        executor = executor_build(name=args.executor)
    except AgentError as exc:
        backend.close()
        logger.error("%s", exc)
        return EXIT_UNAVAILABLE
    loop = AgentLoop(
        backend=backend,
        executor=executor,
        client=IngestClient(server=args.server, token=args.token, timeout_seconds=args.timeout),
        hostname=args.node_name,
        interval_seconds=args.interval,
        backlog_limit=args.backlog,
    )
    try:
        if args.once:
            return _once(loop)
        _run_until_signalled(loop)
        return EXIT_OK
    finally:
        loop.close()


def _once(loop: AgentLoop) -> int:
    report = loop.tick()
    if loop.pending_results:
        report = loop.tick()
    return EXIT_OK if not report.unavailable and report.refused == 0 else EXIT_UNDELIVERED


def _run_until_signalled(loop: AgentLoop) -> None:
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        loop.run(stop=stop)
        return

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        loop.run(stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
