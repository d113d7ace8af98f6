"""Audit events for what happens outside our services: a sign-in lock-out (django-axes)."""

from __future__ import annotations

from axes.signals import user_locked_out
from django.db import transaction
from django.dispatch import receiver

import audit.services as audit


@receiver(user_locked_out)
def lockout_recorded(sender, request, username, ip_address, **kwargs) -> None:
    with transaction.atomic():
        audit.record(
            actor="sign-in throttle",
            action="auth.lockout",
            object_type="auth.user",
            object_id=(username or "")[:64],
            after={
                "username": username or "",
                "ip_address": ip_address or "",
                "path": getattr(request, "path", "")[:200],
            },
        )
