"""The audit chain's keys, from settings (which read them from the environment, never the
database). The first key signs; every key verifies what it signed."""

from __future__ import annotations

from django.conf import settings


class UnknownKey(LookupError):
    """An event or checkpoint names a key this installation does not hold."""


def signing_key() -> tuple[str, str]:
    """(key id, secret) of the key that signs new events and checkpoints."""
    key_id, secret = next(iter(settings.GPUMARKET_AUDIT_KEYS.items()))
    return key_id, secret


def verifying_key(key_id: str) -> str:
    try:
        return settings.GPUMARKET_AUDIT_KEYS[key_id]
    except KeyError:
        raise UnknownKey(key_id) from None
