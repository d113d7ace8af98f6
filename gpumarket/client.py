"""A small Python client for the gpumarket REST API, and the pace helper for training loops.

    from gpumarket.client import Client

    client = Client("https://gpumarket.example.org", token="gm_...")
    rnd = client.open_round()
    bid = client.place_bid(round=rnd["id"], quantity=4, limits={"a100": "2.5"})
    pace = client.pace(allocation=17)
    if pace.allows("heavy"):
        ...  # heavier augmentation, longer sequences

Money is credits written as a decimal string, as the API sends it: "12.500" (three decimals);
prices are credits per GPU-hour. Give limits as strings ("2.5") or Decimals; ``Decimal(text)``
reads any amount exactly. An int or float is refused: an int was milli-credits before the API
moved to credits, and a float cannot hold 0.1 exactly.
Every refusal raises ApiError with the server's code, message and per-field messages.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import requests

MODES = ("light", "moderate", "heavy")
# Which node this machine is, for launches: the first of these set, else the host name.
NODE_ENVS = ("GPUMARKET_NODE", "GPUMARKET_SIM_NODE")


def this_node() -> str:
    """The node name launches use here: GPUMARKET_NODE (the agent's --name), else the
    simulated node's name, else the host name."""
    for name in NODE_ENVS:
        if os.environ.get(name):
            return os.environ[name]
    return socket.gethostname()


class ApiError(Exception):
    """The server refused a request (or could not be reached: status 0)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        fields: dict[str, list[str]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or {}
        self.retry_after = retry_after


def _credits_sent(limits: dict[str, str | Decimal]) -> dict[str, str]:
    """Limits as the API takes them: strings of credits. Refuses what would be ambiguous."""
    sent = {}
    for slug, price in limits.items():
        if isinstance(price, Decimal):
            sent[slug] = format(price, "f")
        elif isinstance(price, str):
            sent[slug] = price
        else:
            raise TypeError(
                f"limit for {slug} must be credits as a string or Decimal, e.g. '2.5', "
                f"not {type(price).__name__} {price!r}"
            )
    return sent


class Client:
    """One API token, one server. Thread-compatible (one requests.Session per client)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        if not token or not token.startswith("gm_"):
            raise ValueError(
                "token must be a personal API token (gm_...), from the API tokens page"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )

    # Transport --------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """``path`` is relative to /api/v1 (e.g. "/bids"). Returns the decoded JSON body."""
        url = f"{self.base_url}/api/v1{path}"
        try:
            response = self.session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise ApiError(0, "unreachable", f"{method} {url}: {exc}") from exc
        if response.status_code >= 400:
            raise self._error(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    @staticmethod
    def _error(response: requests.Response) -> ApiError:
        retry_after = response.headers.get("Retry-After")
        try:
            body = response.json()["error"]
            code, message, fields = body["code"], body["message"], body.get("fields") or {}
        except (ValueError, KeyError, TypeError):
            code, message, fields = "http_error", response.text[:500] or response.reason, {}
        return ApiError(
            response.status_code,
            code,
            message,
            fields,
            float(retry_after) if retry_after and retry_after.isdigit() else None,
        )

    def _pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict]:
        params = {k: v for k, v in (params or {}).items() if v is not None}
        params.setdefault("limit", 200)
        params["offset"] = 0
        while True:
            page = self.request("GET", path, params=params)
            yield from page["results"]
            if not page.get("next"):
                return
            params["offset"] += len(page["results"])

    # Reads ------------------------------------------------------------------------------

    def me(self) -> dict:
        return self.request("GET", "/me")

    def balance(self) -> dict:
        """{"available": "12.500", "escrow": ..., "total": ...} in credits."""
        return self.request("GET", "/balance")

    def tiers(self) -> list[dict]:
        return list(self._pages("/tiers"))

    def rounds(self, *, status: str | None = None) -> list[dict]:
        """Rounds, newest window first; ``status`` e.g. "open", "settled", "finished"."""
        return list(self._pages("/rounds", {"status": status}))

    def open_round(self) -> dict | None:
        """The round open for bids now, or None."""
        rounds = self.request("GET", "/rounds/open")
        return rounds[0] if rounds else None

    def bids(self, *, status: str | None = None, round: int | None = None) -> list[dict]:
        return list(self._pages("/bids", {"status": status, "round": round}))

    def allocations(self, *, status: str | None = None, round: int | None = None) -> list[dict]:
        return list(self._pages("/allocations", {"status": status, "round": round}))

    def allocation(self, allocation: int) -> dict:
        """One allocation, with its placement (node, GPU index, uuid) and ready commands."""
        return self.request("GET", f"/allocations/{int(allocation)}")

    def launch(self, allocation: int, *, node: str | None = None) -> dict:
        """What work on ``node`` (default: this machine, see ``this_node``) needs to run on
        the allocation: {"gpus", "uuids", "env"}. Refused (ApiError) when the allocation is
        not active, not the token's team's, or has no GPUs on the node."""
        return self.request(
            "GET", f"/allocations/{int(allocation)}/launch", params={"node": node or this_node()}
        )

    def run(
        self,
        allocation: int,
        argv: list[str],
        *,
        node: str | None = None,
        env: dict[str, str] | None = None,
        **popen: Any,
    ) -> subprocess.Popen:
        """Start ``argv`` on the allocation's GPUs on this node: CUDA_VISIBLE_DEVICES set to
        them and the allocation and its launch token in the environment, which the node
        agent reports so enforcement lets it run. Returns the process (not waited for)."""
        if not argv:
            raise ValueError("give the command to run, e.g. ['python', 'train.py']")
        launch = self.launch(allocation, node=node)
        return subprocess.Popen(argv, env={**os.environ, **(env or {}), **launch["env"]}, **popen)

    def ledger(self, *, kind: str | None = None) -> list[dict]:
        return list(self._pages("/ledger", {"kind": kind}))

    def budgets(self) -> list[dict]:
        return list(self._pages("/budgets"))

    # Bids -------------------------------------------------------------------------------

    def place_bid(
        self,
        *,
        round: int,
        quantity: int,
        limits: dict[str, str | Decimal],
        min_quantity: int = 0,
        campaign: int | None = None,
        note: str = "",
        idempotency_key: str | None = None,
    ) -> dict:
        """Place a bid; ``limits`` = {tier slug: credits per GPU-hour, "2.5" or Decimal("2.5")}.

        Sent with an Idempotency-Key (a fresh one unless given), so retrying this call with
        the same key after a timeout never places, or escrows, the bid twice.
        """
        body = {
            "round": round,
            "quantity": quantity,
            "min_quantity": min_quantity,
            "limits": _credits_sent(limits),
            "campaign": campaign,
            "note": note,
        }
        key = idempotency_key or str(uuid.uuid4())
        return self.request("POST", "/bids", json=body, headers={"Idempotency-Key": key})

    def edit_bid(
        self,
        bid: int,
        *,
        quantity: int | None = None,
        min_quantity: int | None = None,
        limits: dict[str, str | Decimal] | None = None,
    ) -> dict:
        body = {
            k: v
            for k, v in {
                "quantity": quantity,
                "min_quantity": min_quantity,
                "limits": None if limits is None else _credits_sent(limits),
            }.items()
            if v is not None
        }
        return self.request("PATCH", f"/bids/{int(bid)}", json=body)

    def cancel_bid(self, bid: int) -> dict:
        return self.request("POST", f"/bids/{int(bid)}/cancel")

    # Standing orders --------------------------------------------------------------------

    def orders(self, *, status: str | None = None) -> list[dict]:
        """The team's standing orders, newest first; ``status`` e.g. "active", "paused"."""
        return list(self._pages("/orders", {"status": status}))

    def order(self, order: int) -> dict:
        """One order, with its progress and foresight (win rate, ETA, value for its deadline)."""
        return self.request("GET", f"/orders/{int(order)}")

    def create_order(
        self,
        *,
        name: str,
        values: dict[str, str | Decimal],
        gpus: int,
        ceiling: str | Decimal,
        gpu_hours: float | None = None,
        min_gpus: int | None = None,
        deadline: str | None = None,
        restart_minutes: int = 5,
        campaign: int | None = None,
        command: str = "",
        slurm_job: str = "",
        preemptible: bool = False,
    ) -> dict:
        """A standing order: it bids every round at ``values`` ({tier slug: credits per
        GPU-hour}) until it has ``gpu_hours`` (None: until cancelled), has spent ``ceiling``
        credits, or ``deadline`` (ISO 8601) passes; ``preemptible``: it also takes GPUs
        backfilled within a window."""
        body = {
            "name": name,
            "values": _credits_sent(values),
            "gpus": gpus,
            "min_gpus": min_gpus,
            "gpu_hours": gpu_hours,
            "ceiling": _credits_sent({"ceiling": ceiling})["ceiling"],
            "deadline": deadline,
            "restart_minutes": restart_minutes,
            "campaign": campaign,
            "command": command,
            "slurm_job": slurm_job,
            "preemptible": preemptible,
        }
        return self.request("POST", "/orders", json=body)

    _UNSET: Any = object()

    def edit_order(
        self,
        order: int,
        *,
        name: str | None = None,
        values: dict[str, str | Decimal] | None = None,
        gpus: int | None = None,
        min_gpus: int | None = None,
        gpu_hours: float | None = _UNSET,
        ceiling: str | Decimal | None = None,
        deadline: str | None = _UNSET,
        restart_minutes: int | None = None,
    ) -> dict:
        """Change a live order; what is left out stays. ``gpu_hours=None`` means until
        cancelled, ``deadline=None`` removes the deadline."""
        body: dict[str, Any] = {
            k: v
            for k, v in {
                "name": name,
                "values": None if values is None else _credits_sent(values),
                "gpus": gpus,
                "min_gpus": min_gpus,
                "ceiling": None if ceiling is None else _credits_sent({"c": ceiling})["c"],
                "restart_minutes": restart_minutes,
            }.items()
            if v is not None
        }
        if gpu_hours is not self._UNSET:
            body["gpu_hours"] = gpu_hours
        if deadline is not self._UNSET:
            body["deadline"] = deadline
        return self.request("PATCH", f"/orders/{int(order)}", json=body)

    def pause_order(self, order: int) -> dict:
        return self.request("POST", f"/orders/{int(order)}/pause")

    def resume_order(self, order: int) -> dict:
        return self.request("POST", f"/orders/{int(order)}/resume")

    def cancel_order(self, order: int) -> dict:
        return self.request("POST", f"/orders/{int(order)}/cancel")

    def order_allocation(self, order: int, *, node: str | None = None) -> dict:
        """The allocation the order's work runs on now, placed on ``node`` (default: this
        machine). ApiError 404 when it holds no GPUs there now."""
        return self.request(
            "GET", f"/orders/{int(order)}/allocation", params={"node": node or this_node()}
        )

    # Pace -------------------------------------------------------------------------------

    def pace_reading(self, allocation: int) -> dict:
        """{"mode": ..., "since": ..., "reasons": [...], "numbers": {...}} for one allocation."""
        return self.request("GET", f"/allocations/{int(allocation)}/pace")

    def pace(self, allocation: int, *, min_interval: float = 30.0, fallback: str = "light") -> Pace:
        return Pace(self, allocation, min_interval=min_interval, fallback=fallback)


class Pace:
    """What a training loop polls: ``mode()`` asks the server at most once per
    ``min_interval`` seconds and answers from its cache in between, so calling it every step
    costs nothing. If the server cannot be asked, the last mode is kept; before any answer,
    ``fallback`` ("light") is used, so a loop never pushes hard on a guess.
    """

    def __init__(
        self,
        client: Client,
        allocation: int,
        *,
        min_interval: float = 30.0,
        fallback: str = "light",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fallback not in MODES:
            raise ValueError(f"fallback must be one of {MODES}, got {fallback!r}")
        if min_interval < 0:
            raise ValueError("min_interval must be >= 0 seconds")
        self.client = client
        self.allocation = allocation
        self.min_interval = min_interval
        self.clock = clock
        self._mode = fallback
        self._reading: dict | None = None
        self._asked_at: float | None = None
        self.last_error: ApiError | None = None

    def mode(self) -> str:
        now = self.clock()
        if self._asked_at is None or now - self._asked_at >= self.min_interval:
            self._asked_at = now
            try:
                reading = self.client.pace_reading(self.allocation)
            except ApiError as exc:
                self.last_error = exc
            else:
                self.last_error = None
                self._reading = reading
                self._mode = reading["mode"]
        return self._mode

    def allows(self, mode: str) -> bool:
        """True when the current mode is ``mode`` or heavier (light < moderate < heavy)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return MODES.index(self.mode()) >= MODES.index(mode)

    @property
    def reading(self) -> dict | None:
        """The last answer from the server (with reasons and numbers), if any."""
        return self._reading
