from django.conf import settings
from django.db import models
from django.db.models import Q


class Tenant(models.Model):
    """A research team: holds credits, bids, owns allocations."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    # Entitlement used by the fairness floor and max-min policies (relative, not a share).
    weight = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        RESEARCHER = "researcher", "Researcher"
        MANAGER = "manager", "Manager"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.RESEARCHER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"

    @property
    def is_manager(self) -> bool:
        return self.role == self.Role.MANAGER


class Account(models.Model):
    """A ledger account. Balances are cached sums of entries, in integer milli-credits."""

    class Kind(models.TextChoices):
        AVAILABLE = "available", "Available"
        ESCROW = "escrow", "Escrow"
        ISSUANCE = "issuance", "Issuance (platform)"
        REVENUE = "revenue", "Revenue (platform)"

    TENANT_KINDS = (Kind.AVAILABLE, Kind.ESCROW)
    PLATFORM_KINDS = (Kind.ISSUANCE, Kind.REVENUE)

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="accounts"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    balance = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind"],
                name="account_one_per_tenant_kind",
                condition=Q(tenant__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["kind"], name="account_one_platform_kind", condition=Q(tenant__isnull=True)
            ),
            models.CheckConstraint(
                condition=Q(tenant__isnull=True) | Q(balance__gte=0),
                name="account_tenant_balance_not_negative",
            ),
            models.CheckConstraint(
                condition=(Q(tenant__isnull=True) & Q(kind__in=["issuance", "revenue"]))
                | (Q(tenant__isnull=False) & Q(kind__in=["available", "escrow"])),
                name="account_kind_matches_owner",
            ),
        ]

    def __str__(self) -> str:
        owner = self.tenant.slug if self.tenant_id else "platform"
        return f"{owner}:{self.kind}"


class Campaign(models.Model):
    """A named spending period inside a tenant (a paper deadline, a grant), with its own cap."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="campaigns")
    name = models.CharField(max_length=120)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="campaign_unique_name"),
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="campaign_ends_after_start"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


class Transfer(models.Model):
    """A movement of credits between two accounts; its two entries sum to zero."""

    class Kind(models.TextChoices):
        GRANT = "grant", "Grant"
        HOLD = "hold", "Hold (escrow)"
        RELEASE = "release", "Release (escrow back)"
        CHARGE = "charge", "Charge"
        REFUND = "refund", "Refund"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="transfers")
    amount = models.BigIntegerField()
    source = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+")
    destination = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+")
    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.PROTECT, related_name="transfers"
    )
    # What the transfer is for, e.g. "bid:12" or "round:4"; free text for grants.
    reference = models.CharField(max_length=80, blank=True, db_index=True)
    reason = models.CharField(max_length=300, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="transfer_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.source} -> {self.destination}"


class Entry(models.Model):
    transfer = models.ForeignKey(Transfer, on_delete=models.PROTECT, related_name="entries")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    # Signed milli-credits: negative on the source account, positive on the destination.
    amount = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="entry_amount_nonzero"),
        ]

    def __str__(self) -> str:
        return f"{self.account} {self.amount:+d}"


class LedgerOperation(models.Model):
    """The first outcome of an operation under an idempotency key, refusals included, so a
    retry with the same key returns it instead of moving credits twice."""

    class Outcome(models.TextChoices):
        APPLIED = "applied", "Applied"
        REFUSED = "refused", "Refused"

    key = models.CharField(max_length=120, unique=True)
    # What the key was first used for; a retry that asks for something else is refused.
    fingerprint = models.CharField(max_length=200)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    message = models.CharField(max_length=300, blank=True)
    transfer = models.ForeignKey(Transfer, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.outcome}"


class Budget(models.Model):
    """A cap on charges over a window (see DESIGN.md, "Budgets and spend caps")."""

    class Window(models.TextChoices):
        DAY = "day", "Day"
        WEEK = "week", "Week"
        MONTH = "month", "Month"
        CAMPAIGN = "campaign", "Campaign"

    class Mode(models.TextChoices):
        SAFE = "safe", "Safe (refuse bids that could break the cap)"
        SOFT = "soft", "Soft (alert at 50/80/100 %)"
        HARD = "hard", "Hard (pause work at 100 %)"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="budgets")
    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.PROTECT, related_name="budgets"
    )
    window = models.CharField(max_length=10, choices=Window.choices)
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.SAFE)
    cap = models.BigIntegerField(help_text="Milli-credits per window.")
    active = models.BooleanField(default=True)
    # Set (or last changed) by a platform admin: the team's managers may tighten it, and only
    # an admin loosens it (raises above a threshold wait for a second admin).
    set_by_platform = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "window"]
        constraints = [
            models.CheckConstraint(condition=Q(cap__gte=0), name="budget_cap_not_negative"),
            models.CheckConstraint(
                condition=(Q(window="campaign") & Q(campaign__isnull=False))
                | (~Q(window="campaign") & Q(campaign__isnull=True)),
                name="budget_campaign_iff_campaign_window",
            ),
        ]

    def __str__(self) -> str:
        scope = self.campaign.name if self.campaign_id else self.window
        return f"{self.tenant.slug} {scope} {self.mode} cap {self.cap}"


class Notification(models.Model):
    """Something a tenant should see: a budget alert, a paused job, a voided round."""

    class Level(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        CRITICAL = "critical", "Critical"

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="notifications"
    )
    # Platform notifications (tenant is null) go to admins.
    level = models.CharField(max_length=10, choices=Level.choices, default=Level.INFO)
    kind = models.CharField(max_length=60)
    message = models.CharField(max_length=500)
    # Deduplicates alerts, e.g. "budget:3:2026-11-22:80" fires once per window and threshold.
    dedupe_key = models.CharField(max_length=120, null=True, blank=True, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"[{self.level}] {self.message}"


class ApiToken(models.Model):
    """A personal API token: acts as its user, in that user's tenant.

    The secret is shown once at creation; only its SHA-256 is stored. Tokens carry ~190 bits
    of randomness, so a fast hash is enough (a slow password hash protects guessable secrets,
    and these are not guessable). ``prefix`` is the public, unique part used to find the row.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="apitoken_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"gm_{self.prefix}… ({self.name})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None
