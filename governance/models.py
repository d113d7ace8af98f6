from django.conf import settings
from django.db import models
from django.db.models import F, Q


class ChangeRequest(models.Model):
    """A change that waits for a second person: requested with a justification, then approved
    (and applied, in the same transaction) or rejected by someone else, or left to expire."""

    class Kind(models.TextChoices):
        POLICY_ACTIVATE = "policy_activate", "Activate a policy version"
        CREDIT_GRANT = "credit_grant", "Grant credits"
        TEAM_CREDITS = "team_credits", "Credits for a team (asked by its manager)"
        TIER_CHANGE = "tier_change", "Change a tier's capacity"
        BUDGET_RAISE = "budget_raise", "Raise a budget's cap"
        TENANT_WEIGHT = "tenant_weight", "Change a tenant's weight"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPLIED = "applied", "Approved and applied"
        REJECTED = "rejected", "Rejected"
        EXPIRED = "expired", "Expired"
        WITHDRAWN = "withdrawn", "Withdrawn"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    # The team the change is about, if any (a manager sees their own team's requests).
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # What to apply, as the service takes it (money in milli-credits), and what it changes
    # from, read when requested: an approval of a change whose "from" moved is refused.
    payload = models.JSONField()
    before = models.JSONField(null=True, blank=True)
    summary = models.CharField(max_length=300)
    justification = models.CharField(max_length=1000)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.CharField(max_length=500, blank=True)
    # False when the rule in force did not ask for a second person (applied when asked).
    needed_approval = models.BooleanField(default=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=~Q(justification=""), name="changerequest_justified"),
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")), name="changerequest_expires_later"
            ),
            # The two-person rule, kept by the database too: nobody decides their own request.
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="changerequest_second_person",
            ),
            models.CheckConstraint(
                condition=(Q(status="pending") & Q(decided_at__isnull=True))
                | (Q(status="expired") & Q(decided_by__isnull=True) & Q(decided_at__isnull=False))
                # Withdrawn by the one who asked: nobody decided it.
                | (Q(status="withdrawn") & Q(decided_by__isnull=True) & Q(decided_at__isnull=False))
                | (Q(status="rejected") & Q(decided_by__isnull=False))
                # Applied without a second person only when the rule did not ask for one.
                | (Q(status="applied") & Q(decided_at__isnull=False)),
                name="changerequest_decision_matches_status",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} ({self.status})"
