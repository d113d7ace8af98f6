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
