from django.utils.functional import SimpleLazyObject

from core.auth import is_auditor
from tenants.access import membership_of


def membership(request):
    user = getattr(request, "user", None)
    return {
        "membership": membership_of(user),
        # Lazy: read (one query) only by a page that asks, e.g. the navigation of a non-staff user.
        "is_auditor": SimpleLazyObject(lambda: is_auditor(user)),
    }
