"""The agent's loop: sample -> post -> apply directives -> report outcomes.

One iteration (`tick`) samples every GPU into a new batch, puts it at the end of the
backlog and, unless the server is in backoff, posts the backlog oldest first. Directives in
each response are applied at once; their outcomes travel in the next batch built. Nothing
in an iteration may stop the next one: errors are logged and the loop goes on, because the
agent's job is to watch work, never to get in its way.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from telemetry.agent.backends import Backend
from telemetry.agent.directives import Executor, outcome_combine
from telemetry.agent.protocol import (
    SWEEP_PID,
    Batch,
    Directive,
    DirectiveInvalid,
    DirectiveResult,
    GpuInfo,
    GpuSample,
    ObservedProcess,
    directive_parse,
    sweep_targets,
    utcnow,
)
from telemetry.agent.transport import Delivered, IngestClient, Refused, Unavailable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with "equal jitter": half the delay is fixed, half random, so
    a fleet of agents that lost the server together does not come back in lockstep."""

    base_seconds: float = 1.0
    cap_seconds: float = 60.0

    def delay(self, *, failures: int, rng: random.Random) -> float:
        ceiling = min(self.cap_seconds, self.base_seconds * 2.0 ** min(max(failures - 1, 0), 30))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class TickReport:
    delivered: int
    refused: int
    unavailable: bool
    backlog: int


@dataclass(slots=True)
class LoopStats:
    batches_built: int = 0
    batches_delivered: int = 0
    batches_refused: int = 0
    batches_dropped: int = 0
    samples_dropped: int = 0
    directives_applied: int = 0


class AgentLoop:
    def __init__(
        self,
        *,
        backend: Backend,
        executor: Executor,
        client: IngestClient,
        hostname: str,
        interval_seconds: float = 5.0,
        backlog_limit: int = 1000,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
        remembered_directives: int = 10_000,
    ) -> None:
        if backlog_limit < 1:
            raise ValueError("the backlog must hold at least one batch")
        self.backend = backend
        self.executor = executor
        self.client = client
        self.hostname = hostname
        self.interval_seconds = interval_seconds
        self.backlog_limit = backlog_limit
        self.backoff = backoff or Backoff()
        self.stats = LoopStats()
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._backlog: deque[Batch] = deque()
        self._failures = 0
        self._next_attempt_at = float("-inf")
        self._gpus: tuple[GpuInfo, ...] = ()
        self._observed: dict[int, ObservedProcess] = {}
        # GPU uuid -> its latest sample, with every process (also those not listed in it).
        self._samples: dict[str, GpuSample] = {}
        self._pending: list[DirectiveResult] = []
        # Directive id -> its outcome (None while in progress). Bounded: the server does not
        # resend a directive it has seen acknowledged, so old ids can be forgotten.
        self._applied: OrderedDict[int, DirectiveResult | None] = OrderedDict()
        self._remembered = remembered_directives
        # GPU uuid -> the power cap last applied (None: the GPU's default limit).
        self._power_caps: dict[str, int | None] = {}

    @property
    def backlog(self) -> tuple[Batch, ...]:
        return tuple(self._backlog)

    @property
    def pending_results(self) -> tuple[DirectiveResult, ...]:
        return tuple(self._pending)

    def tick(self) -> TickReport:
        self._collect(self._poll_executor())
        batch = self._build_batch()
        if batch is not None:
            self._enqueue(batch)
        delivered = refused = 0
        unavailable = bool(self._backlog)
        if self._backlog and self._clock() >= self._next_attempt_at:
            delivered, refused, unavailable = self._flush(
                deadline=self._clock() + self.interval_seconds
            )
        return TickReport(
            delivered=delivered,
            refused=refused,
            unavailable=unavailable,
            backlog=len(self._backlog),
        )

    def run(self, *, stop: threading.Event) -> None:
        """Tick every `interval_seconds` until `stop` is set."""
        logger.info(
            "agent started: backend %s, executor %s, posting to %s every %ss",
            self.backend.name,
            self.executor.name,
            self.client.url,
            self.interval_seconds,
        )
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                logger.exception("agent iteration failed; carrying on")
            next_tick += self.interval_seconds
            delay = next_tick - time.monotonic()
            if delay < 0:
                # Fell behind (a slow server, a slow executor): start afresh rather than
                # firing the missed iterations back to back.
                next_tick = time.monotonic()
                delay = 0.0
            stop.wait(delay)
        logger.info(
            "agent stopped with %d batches undelivered (%d samples dropped in all)",
            len(self._backlog),
            self.stats.samples_dropped,
        )

    def close(self) -> None:
        self.backend.close()
        self.client.close()

    def _build_batch(self) -> Batch | None:
        try:
            gpus = self.backend.gpus()
            samples = self.backend.sample()
        except Exception:
            logger.exception("sampling failed; no batch this iteration")
            return None
        self._gpus = gpus
        self._samples = {sample.gpu: sample for sample in samples}
        self._observed = {
            process.pid: ObservedProcess(gpu=sample.gpu, process=process)
            for sample in samples
            for process in sample.processes
        }
        results = tuple(self._pending)
        self._pending.clear()
        self.stats.batches_built += 1
        return Batch(
            backend=self.backend.name,
            hostname=self.hostname,
            gpus=gpus,
            samples=samples,
            directive_results=results,
        )

    def _enqueue(self, batch: Batch) -> None:
        if len(self._backlog) >= self.backlog_limit:
            oldest = self._backlog.popleft()
            self.stats.batches_dropped += 1
            self.stats.samples_dropped += len(oldest.samples)
            # The samples are lost, but outcomes are few and the server waits for them:
            # they ride along with the next batch instead.
            self._pending[:0] = oldest.directive_results
            logger.warning(
                "backlog full (%d batches): dropped the oldest, %d samples dropped so far",
                self.backlog_limit,
                self.stats.samples_dropped,
            )
        self._backlog.append(batch)

    def _flush(self, *, deadline: float) -> tuple[int, int, bool]:
        """Post the backlog in order until it is empty, the server is unavailable, or this
        iteration's time is spent (so sampling keeps its pace while a backlog drains)."""
        delivered = refused = 0
        while self._backlog:
            batch = self._backlog[0]
            result = self.client.post(batch.to_wire(sent_at=self._wall()))
            if isinstance(result, Unavailable):
                self._back_off(result)
                return delivered, refused, True
            self._backlog.popleft()
            self._failures = 0
            if isinstance(result, Refused):
                refused += 1
                self._refused(batch, result)
            elif isinstance(result, Delivered):
                delivered += 1
                self.stats.batches_delivered += 1
                self._handle_directives(result.directives)
                self._power_caps_apply(result.power_caps)
            if self._clock() >= deadline:
                break
        return delivered, refused, False

    def _back_off(self, result: Unavailable) -> None:
        self._failures += 1
        delay = self.backoff.delay(failures=self._failures, rng=self._rng)
        if result.retry_after_seconds is not None:
            delay = max(delay, min(result.retry_after_seconds, self.backoff.cap_seconds))
        self._next_attempt_at = self._clock() + delay
        logger.warning(
            "server unavailable (%s); %d batches kept, next try in %.1fs",
            result.reason,
            len(self._backlog),
            delay,
        )

    def _refused(self, batch: Batch, result: Refused) -> None:
        # A refused batch will be refused again: drop it, say why, and keep going.
        self.stats.batches_refused += 1
        logger.error(
            "server refused batch %s (HTTP %d, %d samples dropped): %s",
            batch.batch_id,
            result.status,
            len(batch.samples),
            result.errors,
        )
        if result.status in (401, 403):
            logger.error("the node token was not accepted; check --token")

    def _power_caps_apply(self, caps: dict[str, int | None]) -> None:
        """Set each GPU's power limit to its tier's cap when the cap changed (a GPU the
        answer leaves out keeps its limit). A backend that cannot set limits, or a GPU that
        refuses (NVML needs root), is logged and tried again with the next answer."""
        setter = getattr(self.backend, "power_cap_set", None)
        index = {gpu.uuid: gpu.index for gpu in self._gpus}
        for uuid, watts in caps.items():
            if (
                uuid not in index
                or self._power_caps.get(uuid, None) == watts
                and (uuid in self._power_caps)
            ):
                continue
            if setter is None:
                logger.warning("backend %s cannot set power limits", self.backend.name)
                return
            try:
                setter(index[uuid], watts)
            except Exception as exc:
                logger.error("cannot set the power limit of GPU %s to %s W: %s", uuid, watts, exc)
                continue
            self._power_caps[uuid] = watts
            logger.info("GPU %s power limit: %s", uuid, f"{watts} W" if watts else "default")

    def _handle_directives(self, raws: Iterable[object]) -> None:
        for raw in raws:
            try:
                directive = directive_parse(raw)
            except DirectiveInvalid as exc:
                logger.error("cannot act on directive: %s", exc)
                if exc.directive_id is not None and exc.directive_id not in self._applied:
                    self._remember(exc.directive_id)
                    self._record(
                        DirectiveResult(id=exc.directive_id, outcome="failed", detail=str(exc))
                    )
                continue
            if directive.id in self._applied:
                self._report_again(directive.id)
                continue
            self._remember(directive.id)
            self.stats.directives_applied += 1
            logger.info(
                "directive %d: %s (gpu %s, pid %s, allocation %s): %s",
                directive.id,
                directive.action,
                directive.gpu,
                directive.pid,
                directive.allocation,
                directive.reason,
            )
            result = self._apply(directive)
            if result is not None:
                self._record(result)

    def _apply(self, directive: Directive) -> DirectiveResult | None:
        known = {gpu.uuid for gpu in self._gpus}
        if directive.gpu is not None and known and directive.gpu not in known:
            return DirectiveResult(
                id=directive.id, outcome="failed", detail=f"GPU {directive.gpu} is not on this node"
            )
        try:
            if directive.action == "pause" and directive.pid == SWEEP_PID:
                return self._sweep(directive)
            return self.executor.apply(directive, observed=self._observed)
        except Exception as exc:
            logger.exception("executor %s failed on directive %d", self.executor.name, directive.id)
            return DirectiveResult(
                id=directive.id,
                outcome="failed",
                detail=f"executor error: {type(exc).__name__}: {exc}",
            )

    def _poll_executor(self) -> list[DirectiveResult]:
        try:
            return self.executor.poll()
        except Exception:
            logger.exception("executor %s failed while polling", self.executor.name)
            return []

    def _collect(self, results: Iterable[DirectiveResult]) -> None:
        for result in results:
            self._record(result)

    def _record(self, result: DirectiveResult) -> None:
        logger.info("directive %d: %s (%s)", result.id, result.outcome, result.detail)
        self._applied[result.id] = result
        self._pending.append(result)

    def _remember(self, directive_id: int) -> None:
        self._applied[directive_id] = None
        while len(self._applied) > self._remembered:
            self._applied.popitem(last=False)

    def _report_again(self, directive_id: int) -> None:
        """The server sent a directive it already had: never apply it twice, but if its
        outcome is known and not on its way (its batch was refused, or delivered and lost),
        report it again. Outcomes are at-least-once; applying is exactly-once."""
        result = self._applied.get(directive_id)
        if result is None:
            return
        if any(pending.id == directive_id for pending in self._pending):
            return
        if any(r.id == directive_id for batch in self._backlog for r in batch.directive_results):
            return
        self._pending.append(result)

    def _sweep(self, directive: Directive) -> DirectiveResult:
        """A pause of pid 0: pause, one by one, every process of the GPU that the latest
        sample did not list and that shares no running listed process's allocation and
        launch token (protocol.sweep_targets), from the backend's full list."""
        sample = self._samples.get(directive.gpu or "")
        if sample is None:
            return DirectiveResult(
                id=directive.id,
                outcome="failed",
                detail=f"a pause of pid {SWEEP_PID} needs a GPU of this node, not {directive.gpu!r}",
            )
        targets = sweep_targets(sample.processes)
        if not targets:
            return DirectiveResult(
                id=directive.id,
                outcome="done",
                detail=f"no unreported work to pause on {directive.gpu}",
            )
        results = []
        for target in targets:
            result = self.executor.apply(
                replace(directive, pid=target.pid, allocation=target.allocation),
                observed=self._observed,
            )
            results.append(
                result
                or DirectiveResult(id=directive.id, outcome="done", detail=f"pid {target.pid}")
            )
        combined = outcome_combine(directive.id, results)
        return replace(
            combined,
            detail=f"paused {len(targets)} unreported process(es) on {directive.gpu}: "
            + combined.detail,
        )
