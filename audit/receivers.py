"""Audit events for what happens outside our services: a sign-in lock-out (django-axes), and
any change of a user's is_staff, is_superuser or is_active, wherever it is saved from (the
admin, a management command, a shell). The admin says who did it (``_audit_actor``)."""

from __future__ import annotations

from axes.helpers import get_failure_limit
from axes.signals import user_locked_out
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver

import audit.services as audit


@receiver(user_locked_out)
def lockout_recorded(sender, request, username, ip_address, **kwargs) -> None:
    # axes signals a lock-out on every refused attempt; the lock begins at the attempt that
    # reaches the limit, and only that one is recorded (400 refused attempts were 401 events).
    limit = get_failure_limit(request, getattr(request, "axes_credentials", None))
    if getattr(request, "axes_failures_since_start", limit) != limit:
        return
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


USER_FLAGS = ("is_active", "is_staff", "is_superuser")


def _touches_flags(update_fields) -> bool:
    return update_fields is None or bool(set(update_fields) & set(USER_FLAGS))


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def user_flags_before(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    instance._audit_flags_before = None
    if raw or instance.pk is None or not _touches_flags(update_fields):
        return
    instance._audit_flags_before = sender.objects.filter(pk=instance.pk).values(*USER_FLAGS).first()


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def user_flags_recorded(
    sender, instance, created=False, raw=False, update_fields=None, **kwargs
) -> None:
    if raw or not _touches_flags(update_fields):
        return
    after = {flag: bool(getattr(instance, flag)) for flag in USER_FLAGS}
    before = getattr(instance, "_audit_flags_before", None)
    if created:
        if not (instance.is_staff or instance.is_superuser):
            return  # a plain new account changes no privilege
    elif before is None or before == after:
        return
    with transaction.atomic():
        audit.record(
            actor=getattr(instance, "_audit_actor", None) or "system",
            action="user.flags",
            object_type="auth.user",
            object_id=instance.pk,
            before=before,
            after=after,
        )
