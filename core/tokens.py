"""Bearer tokens (node tokens and personal API tokens): ``<scheme><prefix>_<secret>``.

The prefix (12 hex characters) is public: it finds the row and tells tokens apart in lists.
The whole string is hashed with SHA-256 and only the hash is stored, so a database leak does
not leak tokens; the caller shows the secret once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX_LENGTH = 12  # hex characters
_NO_HASH = "0" * 64


@dataclass(frozen=True)
class Minted:
    secret: str  # the whole token; exists only here and with the caller, never stored
    prefix: str
    hash: str


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def token_mint(*, scheme: str) -> Minted:
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    secret = f"{scheme}{prefix}_{secrets.token_urlsafe(32)}"
    return Minted(secret=secret, prefix=prefix, hash=token_hash(secret))


def token_prefix(raw: str, *, scheme: str) -> str | None:
    """The public prefix of a token of ``scheme``, or None if ``raw`` does not have its shape."""
    if not raw.startswith(scheme):
        return None
    prefix, sep, secret = raw[len(scheme) :].partition("_")
    if len(prefix) != PREFIX_LENGTH or not sep or not secret:
        return None
    return prefix


def token_matches(raw: str, stored_hash: str | None) -> bool:
    """Whether ``raw`` hashes to ``stored_hash``, in constant time. Compares even when there
    is no stored hash, so timing does not tell a wrong prefix from a wrong secret."""
    matches = hmac.compare_digest(stored_hash or _NO_HASH, token_hash(raw))
    return matches and stored_hash is not None
