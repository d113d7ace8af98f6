"""Declared demand (teams' upcoming campaigns) and capacity scenarios (staff what-ifs)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class PlannedCampaign(models.Model):
    """A team's declared upcoming demand: GPU-hours it expects to need between two dates, on
    any of some tiers. A demand signal for planning, not a reservation or a bid."""

    class Priority(models.IntegerChoices):
        LOW = 1, "Low"
        NORMAL = 2, "Normal"
        HIGH = 3, "High"

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="planned_campaigns"
    )
    name = models.CharField(max_length=120)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    gpu_hours = models.PositiveIntegerField()
    tiers = models.ManyToManyField("market.Tier", related_name="planned_campaigns")
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    withdrawn_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")),
                name="planned_campaign_ends_after_start",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hours__gt=0), name="planned_campaign_gpu_hours_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class Scenario(models.Model):
    """A capacity what-if: its inputs as given (the scenario document), and once run, its
    results. Kept with both so a plan can be read again later exactly as it was made."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    name = models.CharField(max_length=120)
    inputs = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    results = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"scenario {self.pk}: {self.name}"

    @property
    def progress_pct(self) -> int:
        if not self.progress_total:
            return 0
        return round(100 * self.progress_done / self.progress_total)
