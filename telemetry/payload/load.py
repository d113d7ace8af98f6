"""The request body of an agent batch as JSON: refused with a clear 4xx if it is empty, not
UTF-8, not JSON (NaN and Infinity included), or not an object."""

from __future__ import annotations

import json
from typing import Any

from telemetry.errors import TelemetryError


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows; send finite numbers only")


def payload_load(body: bytes) -> dict[str, Any]:
    """Parse the request body. Python's json accepts NaN and Infinity; the protocol does not."""
    if not body:
        raise TelemetryError(
            "the request body is empty", errors={"body": ["is empty; send a JSON batch"]}
        )
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise TelemetryError(
            "the body is not UTF-8", errors={"body": [f"is not UTF-8 text: {exc}"]}
        ) from exc
    except RecursionError:
        raise TelemetryError(
            "the body is nested too deeply",
            errors={"body": ["is nested too deeply; a batch is a few levels of objects and lists"]},
        ) from None
    except ValueError as exc:
        # JSONDecodeError (truncated or malformed) and the NaN/Infinity refusal above.
        raise TelemetryError(
            f"the body is not valid JSON: {exc}", errors={"body": [f"is not valid JSON: {exc}"]}
        ) from exc
    if type(data) is not dict:
        raise TelemetryError(
            "the body must be a JSON object",
            errors={"body": [f"must be a JSON object, not {type(data).__name__}"]},
        )
    return data
