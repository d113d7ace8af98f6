"""Reads of the alerts app, scoped to the caller's team."""

from __future__ import annotations

from django.db.models import QuerySet

from alerts.models import AlertPreference, Delivery, Webhook
from tenants.access import scoped
from tenants.models import Tenant


def preference_of(user) -> list[str]:
    preference = AlertPreference.objects.filter(user=user).first()
    return list(preference.email_categories) if preference else []


def webhooks_of(tenant: Tenant) -> QuerySet[Webhook]:
    return scoped(Webhook.objects, tenant=tenant).order_by("-active", "pk")


def deliveries_of(tenant: Tenant | None, *, limit: int = 50) -> QuerySet[Delivery]:
    """The latest deliveries of ``tenant``'s notices (None: the platform's, for staff)."""
    rows = (
        Delivery.objects.filter(tenant__isnull=True)
        if tenant is None
        else scoped(Delivery.objects, tenant=tenant)
    )
    return rows.select_related("user", "webhook").order_by("-created_at", "-pk")[:limit]
