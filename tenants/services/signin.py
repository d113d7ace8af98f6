"""Sign-in locks (django-axes): lifting one early, from the admin."""

from __future__ import annotations

from collections.abc import Iterable

from axes.utils import reset as axes_reset
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit


@transaction.atomic
def signin_unlock(*, ip_addresses: Iterable[str], actor: AbstractBaseUser) -> int:
    """Forget the failed sign-ins from these addresses, which lifts every lock on them (the
    address's own and each username's from it). One audit event; returns attempts removed."""
    addresses = sorted({ip for ip in ip_addresses if ip})
    removed = sum(axes_reset(ip=ip) for ip in addresses)
    audit.record(
        actor=actor,
        action="auth.unlock",
        object_type="auth.address",
        object_id=",".join(addresses)[:64],
        after={"ip_addresses": addresses, "attempts_removed": removed},
    )
    return removed
