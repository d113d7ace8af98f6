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


def _auditor_group() -> str:
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
        cached = user.groups.filter(name=_auditor_group()).exists()
        setattr(user, _AUDITOR_CACHE, cached)
    return cached


def auditor_exists(user_field: str):
    """An ``Exists`` that answers ``is_auditor`` inside a query that already reads the user
    (the API token lookup), so the check costs no statement of its own."""
    from django.contrib.auth.models import Group
    from django.db.models import Exists, OuterRef

    return Exists(Group.objects.filter(name=_auditor_group(), user=OuterRef(user_field)))


def auditor_known(user, value: bool) -> None:
    """Record on ``user`` what ``auditor_exists`` answered, for ``is_auditor``."""
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
