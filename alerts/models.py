"""Who wants which alerts by email, the teams' webhooks, and every delivery with its fate."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.models import Tenant


class AlertPreference(models.Model):
    """The categories (alerts.kinds.CATEGORIES) a user wants by email. No row: none."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_preference"
    )
    email_categories = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"alerts of {self.user}: {', '.join(self.email_categories) or 'none'}"


class Webhook(models.Model):
    """A team's endpoint: each digest of the categories it takes is POSTed there, signed
    with HMAC-SHA256 under its secret (shown to the manager once, kept sealed to sign:
    ``core.sealed``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="webhooks")
    url = models.URLField(max_length=500)
    categories = models.JSONField(default=list)
    secret_sealed = models.TextField()
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "pk"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of {self.tenant}: {self.url}"


class Delivery(models.Model):
    """One digest to one recipient (an email address or a webhook), and what became of it."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        WEBHOOK = "webhook", "Webhook"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        RETRYING = "retrying", "Retrying"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    channel = models.CharField(max_length=10, choices=Channel.choices)
    # The team whose notices it carries; null for platform notices (to staff).
    tenant = models.ForeignKey(
        Tenant, null=True, on_delete=models.PROTECT, related_name="alert_deliveries"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    webhook = models.ForeignKey(
        Webhook, null=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    target = models.CharField(max_length=500)  # the address or URL at the time
    payload = models.JSONField()
    notices = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True)
    next_attempt_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.channel} delivery {self.pk} to {self.target}: {self.status}"


class DigestCursor(models.Model):
    """The last notification a digest run has handed out, so each goes out once."""

    name = models.CharField(max_length=40, unique=True)
    last_notification_id = models.BigIntegerField(default=0)
    ran_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.name} at notification {self.last_notification_id}"
