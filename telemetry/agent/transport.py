"""POST one batch to the ingest endpoint and classify what came back.

Three answers matter to the loop: Delivered (stored, or already stored: drop it from the
backlog and apply the directives), Refused (the server will never take this batch: drop it)
and Unavailable (keep it and try again later).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import requests

from telemetry.agent.protocol import AGENT_VERSION, INGEST_PATH

logger = logging.getLogger(__name__)

# Refusals that are about the moment, not the batch: a timeout on the server's side and a
# rate limit. These are retried like a 5xx instead of dropped.
RETRYABLE_4XX = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class Delivered:
    stored: int
    duplicate: bool
    directives: tuple[Any, ...]
    # GPU uuid -> the power limit in watts its tier wants (None: no cap, the GPU's default).
    power_caps: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    errors: Any


@dataclass(frozen=True, slots=True)
class Unavailable:
    reason: str
    retry_after_seconds: float | None = None


PostResult = Delivered | Refused | Unavailable


class IngestClient:
    def __init__(
        self,
        *,
        server: str,
        token: str,
        timeout_seconds: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        self.url = server.rstrip("/") + INGEST_PATH
        self._timeout = timeout_seconds
        self._session = session if session is not None else requests.Session()
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "User-Agent": f"gpumarket-agent/{AGENT_VERSION}",
        }

    def close(self) -> None:
        self._session.close()

    def post(self, payload: dict[str, Any]) -> PostResult:
        try:
            response = self._session.post(
                self.url,
                data=json.dumps(payload).encode(),
                headers=self._headers,
                timeout=self._timeout,
                # A redirect (http -> https, a missing slash) would turn the POST into a
                # GET and lose the body; better to say the server address is wrong.
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            return Unavailable(reason=f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if 200 <= status < 300:
            return _delivered(response)
        if 300 <= status < 400:
            return Unavailable(
                reason=f"{status} redirect to {response.headers.get('Location')!r}; check --server"
            )
        if 400 <= status < 500 and status not in RETRYABLE_4XX:
            return Refused(status=status, errors=_errors(response))
        return Unavailable(reason=f"HTTP {status}", retry_after_seconds=_retry_after(response))


def _delivered(response: requests.Response) -> Delivered:
    try:
        body = response.json()
    except ValueError:
        # The batch was stored (2xx); only the directives are lost, and the server sends
        # pending directives again with the next response.
        logger.error("ingest answered %d with a body that is not JSON", response.status_code)
        return Delivered(stored=0, duplicate=False, directives=())
    if not isinstance(body, dict):
        logger.error("ingest answered with %r instead of an object", type(body).__name__)
        return Delivered(stored=0, duplicate=False, directives=())
    directives = body.get("directives") or []
    if not isinstance(directives, list):
        logger.error("ingest answered with directives that are not a list: %r", directives)
        directives = []
    stored = body.get("stored")
    return Delivered(
        stored=stored if isinstance(stored, int) else 0,
        duplicate=bool(body.get("duplicate", False)),
        directives=tuple(directives),
        power_caps=_power_caps(body.get("power_caps")),
    )


# The highest power limit the agent will set, in watts (the server's power_w range).
POWER_CAP_MAX_W = 10_000


def _power_caps(raw: Any) -> dict[str, int | None]:
    """The answer's power caps; an entry that is not {uuid: whole watts 1..10000 or null} is
    logged and left out (that GPU's limit stays as it is)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        logger.error("ingest answered with power_caps that are not an object: %r", raw)
        return {}
    caps: dict[str, int | None] = {}
    for uuid, watts in raw.items():
        if watts is None or (
            type(watts) is int and 1 <= watts <= POWER_CAP_MAX_W and isinstance(uuid, str)
        ):
            caps[uuid] = watts
        else:
            logger.error("ingest answered with a bad power cap for %r: %r", uuid, watts)
    return caps


def _errors(response: requests.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return body.get("errors", body) if isinstance(body, dict) else body


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None  # an HTTP date: rare enough to leave to the normal backoff
