"""Secrets the platform must read back (a webhook's signing key), sealed at rest.

Fernet from the cryptography package (AES-128-CBC with an HMAC-SHA256 tag) under a key
derived by HKDF-SHA256 from ``SECRET_KEY``, so a copy of the database alone opens nothing.
A key named in ``SECRET_KEY_FALLBACKS`` still opens what it sealed: rotate SECRET_KEY with
the old one kept there until every secret has been sealed again or replaced.
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from core.errors import DomainError

_INFO = b"gpumarket sealed secrets v1"


class SealBroken(DomainError):
    """A sealed secret that none of this installation's keys opens."""


def _fernet(secret_key: str) -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(
        secret_key.encode()
    )
    return Fernet(base64.urlsafe_b64encode(key))


def _box() -> MultiFernet:
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return MultiFernet([_fernet(k) for k in keys])


def seal(secret: str) -> str:
    """``secret`` sealed under the current SECRET_KEY, as text for a column."""
    return _box().encrypt(secret.encode()).decode("ascii")


def unseal(sealed: str, *, what: str, remedy: str) -> str:
    """The secret ``seal`` made; SealBroken, naming ``what`` and the ``remedy``, if no key
    opens it (SECRET_KEY changed and the old one is not in SECRET_KEY_FALLBACKS)."""
    try:
        return _box().decrypt(sealed.encode("ascii")).decode()
    except (InvalidToken, ValueError) as exc:
        raise SealBroken(
            f"{what} was sealed under a SECRET_KEY this installation no longer has (not in "
            f"SECRET_KEY_FALLBACKS): put the old key back in SECRET_KEY_FALLBACKS, or {remedy}"
        ) from exc
