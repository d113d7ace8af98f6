"""Launch tokens: what binds a process on a node to the allocation it claims.

``gpumarket run`` gets a token from the API (only members of the allocation's team can) and
starts the work with it in GPUMARKET_LAUNCH_TOKEN; the node agent reports it with the
process, and enforcement pauses work of a placed allocation whose token does not verify. The
token is an HMAC-SHA256, keyed with the allocation's own secret, of the allocation id, the
node and the GPUs placed for it there, so a token is good for one allocation on one node's
GPUs and nowhere else. Pure: no Django.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

TOKEN_ENV = "GPUMARKET_LAUNCH_TOKEN"
# Hex of a SHA-256 digest; the agent clips longer claims.
TOKEN_CHARS = 64


def _message(allocation_id: int, node: str, uuids: Iterable[str]) -> bytes:
    return f"gpumarket-launch:{int(allocation_id)}:{node}:{','.join(sorted(uuids))}".encode()


def launch_token(*, secret: str, allocation_id: int, node: str, uuids: Iterable[str]) -> str:
    if not secret:
        raise ValueError("an allocation without a launch secret has no launch token")
    return hmac.new(
        secret.encode(), _message(allocation_id, node, uuids), hashlib.sha256
    ).hexdigest()


def launch_token_valid(
    token: str | None, *, secret: str, allocation_id: int, node: str, uuids: Iterable[str]
) -> bool:
    if not token or not secret:
        return False
    expected = launch_token(secret=secret, allocation_id=allocation_id, node=node, uuids=uuids)
    return hmac.compare_digest(token, expected)
