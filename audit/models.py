from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """One decision, in a keyed hash chain: ``hash`` is an HMAC, under a key kept outside the
    database, of this event's canonical form and the previous event's hash, so an edited,
    deleted, inserted or reordered row breaks the chain, and nobody without the key can
    recompute it. Signed checkpoints of the head (audit/checkpoints.py) catch a cut tail.

    Rows are append-only: the application never updates or deletes them, and a database
    trigger (see the migrations) refuses it.
    """

    seq = models.BigIntegerField(unique=True)
    created_at = models.DateTimeField()
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Kept as text too, so the record reads right even for system actors (beat, agents).
    actor_label = models.CharField(max_length=150)
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    action = models.CharField(max_length=80, db_index=True)
    object_type = models.CharField(max_length=80, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    # Which of the installation's keys (settings.GPUMARKET_AUDIT_KEYS) signed ``hash``.
    key_id = models.CharField(max_length=32)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["seq"]
        indexes = [
            models.Index(fields=["created_at"]),
            models.Index(fields=["object_type", "object_id"]),
        ]

    def __str__(self) -> str:
        return (
            f"#{self.seq} {self.action} {self.object_type}:{self.object_id} by {self.actor_label}"
        )


class CheckpointRecord(models.Model):
    """The database's own note of each checkpoint written to the checkpoint file
    (audit/checkpoints.py). The file is what proves the tail; this only lets verify-audit see
    that the file it reads is missing lines the application wrote (an old copy, a cut tail)."""

    seq = models.BigIntegerField(unique=True)
    taken_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"checkpoint of seq {self.seq} at {self.taken_at:%Y-%m-%d %H:%M:%S}"
