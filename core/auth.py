"""The guard on staff pages (the admin site has its own)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest


def staff_required(view: Callable) -> Callable:
    """Anonymous -> login page; signed in but not platform staff -> 403."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs):
        if not request.user.is_staff:
            raise PermissionDenied("This page is for platform administrators.")
        return view(request, *args, **kwargs)

    return wrapped


_AUDITOR_CACHE = "_gpumarket_is_auditor"


def auditor_group() -> str:
    """The name of the group whose members are auditors."""
    from django.conf import settings

    return getattr(settings, "GPUMARKET_AUDITOR_GROUP", "auditor")


def is_auditor(user) -> bool:
    """Whether ``user`` holds the read-only auditor role: membership of the group named by
    ``settings.GPUMARKET_AUDITOR_GROUP``. Read-only wins: an auditor writes nothing, even one
    who is also staff. Cached on the user object for the request."""
    if user is None or not user.is_authenticated:
        return False
    cached = getattr(user, _AUDITOR_CACHE, None)
    if cached is None:
        cached = user.groups.filter(name=auditor_group()).exists()
        setattr(user, _AUDITOR_CACHE, cached)
    return cached


def auditor_known(user, value: bool) -> None:
    """Record on ``user`` whether it is an auditor, read with another query (the API token
    lookup), for ``is_auditor``."""
    setattr(user, _AUDITOR_CACHE, bool(value))


def staff_or_auditor_required(view: Callable) -> Callable:
    """Staff pages an auditor may read: GET and HEAD for staff and auditors, anything else
    for staff only (an auditor's write is refused before the view by the read-only guard)."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs):
        user = request.user
        reading = request.method in ("GET", "HEAD")
        if is_auditor(user):
            if not reading:
                raise PermissionDenied("The auditor role reads; it changes nothing.")
        elif not user.is_staff:
            raise PermissionDenied("This page is for platform administrators and auditors.")
        return view(request, *args, **kwargs)

    return wrapped
