"""Tiers, policy versions, rounds, bids and allocations. Money is integer milli-credits;
prices are milli-credits per GPU-hour."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class Tier(models.Model):
    """A pool of like GPUs. Reserve prices and share caps live in the policy version."""

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=120)
    gpu_model = models.CharField(max_length=120, blank=True)
    # Healthy GPUs registered in this tier; kept current by telemetry, or set by an admin for a
    # tier with no registered nodes.
    capacity = models.PositiveIntegerField(default=0)
    maintenance_gpus = models.PositiveIntegerField(default=0)
    preemptible = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    # Milli-credits per kWh its allocations pay for the energy their GPUs used (metered after
    # the window, docs/capacity.md "Energy"); 0 = energy is not charged.
    energy_price = models.PositiveBigIntegerField(default=0)
    # Watts each of its GPUs may draw: the agent sets it as the GPU's power limit and
    # enforcement reports a GPU above it; null = no cap.
    power_cap_w = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def offered(self) -> int:
        """GPUs offered to the next round: healthy capacity less maintenance."""
        return max(self.capacity - self.maintenance_gpus, 0)


class PolicyVersion(models.Model):
    """One version of the market policy. Exactly one is active; a candidate may run in shadow.

    Versions are never edited once created: a change (or a rollback) is a new version whose
    ``parent`` is the one it came from, so history stays linear and reversible.
    """

    class Mechanism(models.TextChoices):
        WELFARE = "welfare", "Welfare (uniform price per tier)"
        FISHER = "fisher", "Fisher market (Eisenberg-Gale)"
        MAXMIN = "maxmin", "Weighted max-min fairness"

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        ACTIVE = "active", "Active"
        SHADOW = "shadow", "Shadow"
        RETIRED = "retired", "Retired"

    number = models.PositiveIntegerField(unique=True)
    mechanism = models.CharField(
        max_length=20, choices=Mechanism.choices, default=Mechanism.WELFARE
    )
    params = models.JSONField(default=dict, blank=True)
    # {tier slug: milli-credits per GPU-hour}; a tier missing here has reserve 0.
    reserve_prices = models.JSONField(default=dict, blank=True)
    # {tier slug: max fraction of the tier one tenant may win, as a percentage 1..100}.
    max_share_pct = models.JSONField(default=dict, blank=True)
    round_minutes = models.PositiveIntegerField(default=60)
    # Bidding for a round closes this long before its window starts.
    lead_minutes = models.PositiveIntegerField(default=0)
    # Limits that trigger an automatic rollback (see DESIGN.md "Policy versions").
    guardrails = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT)
    note = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=Q(status="active"), name="policy_one_active"
            ),
            models.UniqueConstraint(
                fields=["status"], condition=Q(status="shadow"), name="policy_one_shadow"
            ),
            models.CheckConstraint(
                condition=Q(round_minutes__gte=1), name="policy_round_minutes_min"
            ),
        ]

    def __str__(self) -> str:
        return f"v{self.number} {self.mechanism} ({self.status})"

    def reserve_for(self, tier_slug: str) -> int:
        return int(self.reserve_prices.get(tier_slug, 0))

    def max_share_for(self, tier_slug: str) -> int:
        return int(self.max_share_pct.get(tier_slug, 100))


class Round(models.Model):
    """The auction for one allocation window [starts_at, ends_at)."""

    class Status(models.TextChoices):
        OPEN = "open", "Open for bids"
        CLOSED = "closed", "Bidding closed"
        CLEARED = "cleared", "Cleared"
        SETTLED = "settled", "Settled"
        FINISHED = "finished", "Finished"
        FAILED = "failed", "Failed"
        VOIDED = "voided", "Voided"

    policy = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="rounds")
    shadow_policy = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="shadow_rounds"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    opens_at = models.DateTimeField()
    closes_at = models.DateTimeField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    # Filled by clearing: {tier slug: capacity offered}, {tier slug: milli-credits/GPU-hour},
    # the solver's diagnostics, and the shadow policy's outcome for comparison.
    capacities = models.JSONField(default=dict, blank=True)
    prices = models.JSONField(default=dict, blank=True)
    diagnostics = models.JSONField(default=dict, blank=True)
    shadow_result = models.JSONField(null=True, blank=True)
    # What the solver awarded, kept from clearing to settlement (two transactions):
    # [[bid id, tier slug, gpus], ...]. Settlement turns it into allocations and charges.
    awards = models.JSONField(default=list, blank=True)
    revenue = models.BigIntegerField(default=0)
    failure_reason = models.CharField(max_length=500, blank=True)
    cleared_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.UniqueConstraint(fields=["starts_at"], name="round_unique_window_start"),
            # "Exactly one round open for bidding", held by the database as well as the service.
            models.UniqueConstraint(
                fields=["status"], condition=Q(status="open"), name="round_one_open"
            ),
            models.CheckConstraint(
                condition=Q(ends_at__gt=F("starts_at")), name="round_window_positive"
            ),
            models.CheckConstraint(
                condition=Q(closes_at__lte=F("starts_at")), name="round_closes_before_start"
            ),
        ]
        indexes = [models.Index(fields=["status", "closes_at"])]

    def __str__(self) -> str:
        return (
            f"round {self.pk} [{self.starts_at:%Y-%m-%d %H:%M}, {self.ends_at:%H:%M}) {self.status}"
        )

    @property
    def hours(self) -> float:
        return (self.ends_at - self.starts_at).total_seconds() / 3600


class Order(models.Model):
    """A standing order: a team's request for GPU-hours that the round opener turns into a
    bid every round (market/orders.py) until it is done, cancelled, out of its ceiling or past
    its deadline. The work it drives keeps running while it wins, and is suspended (not
    killed) when it loses; it resumes when it wins again."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        PAUSED = "paused", "Paused"
        DONE = "done", "Done"
        CANCELLED = "cancelled", "Cancelled"
        EXHAUSTED = "exhausted", "Out of its ceiling"
        EXPIRED = "expired", "Past its deadline"

    LIVE = (Status.ACTIVE, Status.PAUSED)

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="orders")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="orders"
    )
    campaign = models.ForeignKey(
        "tenants.Campaign", null=True, blank=True, on_delete=models.PROTECT, related_name="orders"
    )
    name = models.CharField(max_length=120)
    gpus = models.PositiveIntegerField()
    # All or nothing below it: gpus for a rigid gang, 1 when any number of GPUs helps.
    min_gpus = models.PositiveIntegerField()
    # GPU-hours wanted, in GPU-seconds; NULL: until cancelled.
    gpu_seconds_wanted = models.BigIntegerField(null=True, blank=True)
    # The most it may spend in all, milli-credits.
    ceiling = models.BigIntegerField()
    deadline = models.DateTimeField(null=True, blank=True)
    # Work lost each time it is stopped or moved (from its last checkpoint).
    restart_seconds = models.PositiveIntegerField(default=300)
    # What `gpumarket run --order` starts on the order's GPUs, or the Slurm job it drives.
    command = models.CharField(max_length=1000, blank=True)
    slurm_job = models.CharField(max_length=64, blank=True)
    # Accepts preemptible capacity: besides its bid in every round, it bids in the backfill
    # sub-rounds for unsold and reclaimed GPUs (market/services/backfill.py).
    preemptible = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    # Why it stopped (done, exhausted, expired, cancelled) or was paused.
    status_reason = models.CharField(max_length=300, blank=True)
    # Why it made no bid in the latest round although active ("" when it bid).
    hold_reason = models.CharField(max_length=300, blank=True)
    # Progress, kept by settlement: GPU-seconds won, milli-credits charged, rounds.
    gpu_seconds = models.BigIntegerField(default=0)
    spent = models.BigIntegerField(default=0)
    rounds_won = models.PositiveIntegerField(default=0)
    rounds_lost = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    # A client's retry key (the API's Idempotency-Key): creating with a key used before
    # returns the first order instead of a second one.
    idempotency_key = models.CharField(max_length=80, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="order_gpus_positive"),
            models.CheckConstraint(
                condition=Q(min_gpus__gte=1) & Q(min_gpus__lte=F("gpus")),
                name="order_min_gpus_in_range",
            ),
            models.CheckConstraint(condition=Q(ceiling__gt=0), name="order_ceiling_positive"),
            models.CheckConstraint(
                condition=Q(spent__lte=F("ceiling")), name="order_spent_within_ceiling"
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="order_unique_idempotency_key",
            ),
        ]
        indexes = [models.Index(fields=["status", "tenant"])]

    def __str__(self) -> str:
        return f"order {self.pk} {self.name!r} ({self.status})"

    @property
    def live(self) -> bool:
        return self.status in self.LIVE


class OrderLimit(models.Model):
    """The most an order pays on one tier, milli-credits per GPU-hour. No row = not acceptable."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="limits")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="+")
    price = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "tier"], name="orderlimit_unique_tier"),
            models.CheckConstraint(condition=Q(price__gt=0), name="orderlimit_price_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tier.slug} <= {self.price}"


class Bid(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", "Open"
        CANCELLED = "cancelled", "Cancelled"
        WON = "won", "Won"
        LOST = "lost", "Lost"
        REFUNDED = "refunded", "Refunded"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="bids")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bids"
    )
    round = models.ForeignKey(Round, on_delete=models.PROTECT, related_name="bids")
    campaign = models.ForeignKey(
        "tenants.Campaign", null=True, blank=True, on_delete=models.PROTECT, related_name="bids"
    )
    # The standing order that made this bid at the round's open; NULL for a hand-placed bid.
    order = models.ForeignKey(
        Order, null=True, blank=True, on_delete=models.PROTECT, related_name="bids"
    )
    # The backfill sub-round this bid was made in (``round`` is the window's round); NULL for a
    # bid in the round itself.
    backfill = models.ForeignKey(
        "Backfill", null=True, blank=True, on_delete=models.PROTECT, related_name="bids"
    )
    quantity = models.PositiveIntegerField()
    # Gang minimum: all or nothing below it. 0 = any quantity up to ``quantity`` is useful.
    min_quantity = models.PositiveIntegerField(default=0)
    # Milli-credits currently held in escrow for this bid.
    escrow = models.BigIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    note = models.CharField(max_length=200, blank=True)
    # Why the bid won less than it asked (or that it won it all), set at settlement
    # (market/outcomes.py); empty while open or when cancelled.
    outcome = models.CharField(max_length=20, blank=True)
    outcome_reason = models.CharField(max_length=300, blank=True)
    # A client's retry key (e.g. the API's Idempotency-Key): placing the same bid twice with
    # one key returns the first bid instead of holding escrow twice.
    idempotency_key = models.CharField(max_length=80, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(quantity__gte=1), name="bid_quantity_positive"),
            models.CheckConstraint(
                condition=Q(min_quantity__lte=F("quantity")), name="bid_min_le_quantity"
            ),
            models.CheckConstraint(condition=Q(escrow__gte=0), name="bid_escrow_not_negative"),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="bid_unique_idempotency_key",
            ),
            # One open bid per order and round: the opener may run twice, the second adds
            # nothing; an order edited or resumed bids again once its bid is cancelled.
            models.UniqueConstraint(
                fields=["order", "round"],
                condition=Q(order__isnull=False, status="open"),
                name="bid_one_open_per_order_round",
            ),
        ]
        indexes = [models.Index(fields=["round", "status"])]

    def __str__(self) -> str:
        return f"bid {self.pk} {self.tenant_id} x{self.quantity} ({self.status})"


class BidLimit(models.Model):
    """The most a bid will pay on one tier, milli-credits per GPU-hour. No row = not acceptable."""

    bid = models.ForeignKey(Bid, on_delete=models.CASCADE, related_name="limits")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="+")
    price = models.BigIntegerField()
    # The most the bid pays on this tier where that is below ``price``: an order's stated
    # value, where ``price`` (what the clearing sees) adds its restart value as the incumbent
    # of this tier (market/orders.py). NULL: it pays at most ``price``.
    charge_limit = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["bid", "tier"], name="bidlimit_unique_tier"),
            models.CheckConstraint(condition=Q(price__gt=0), name="bidlimit_price_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tier.slug} <= {self.price}"


class Allocation(models.Model):
    """GPUs won by a bid on one tier for the round's window."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        # Only the enforcement loop pauses an allocation, and only for a hard spend cap.
        PAUSED = "paused", "Paused (cap)"
        # The window ended while work still ran, and the work was stopped: a normal end.
        PREEMPTED = "preempted", "Ended (work stopped)"
        FINISHED = "finished", "Ended"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="allocations"
    )
    round = models.ForeignKey(Round, on_delete=models.PROTECT, related_name="allocations")
    bid = models.ForeignKey(Bid, on_delete=models.PROTECT, related_name="allocations")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="allocations")
    gpus = models.PositiveIntegerField()
    # What this allocation pays: min(tier price, the bid's limit), per GPU-hour; and in total.
    price = models.BigIntegerField()
    charge = models.BigIntegerField()
    # Milli-credits refunded because a hard cap paused it before any work ran on it (0 when
    # not); charged again, and reset to 0, if it resumes.
    cap_refund = models.BigIntegerField(default=0)
    # The GPUs it runs on, set when it is settled: [{"node", "index", "uuid"}], sorted. Empty
    # when the tier's GPUs are not reported by any node (capacity typed in by hand).
    placement = models.JSONField(default=list, blank=True)
    # Key of the launch tokens (market/placement/launch.py) that bind work on a node to this
    # allocation; set with the placement, never shown. "" when not placed.
    launch_secret = models.CharField(max_length=64, blank=True, editable=False)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    # Won in a backfill sub-round: on unsold or reclaimed GPUs, to the window's end at most.
    preemptible = models.BooleanField(default=False)
    # Whole joules its placed GPUs used in its window, metered from their energy counters
    # once the window is over (null until then), and the milli-credits charged for it at the
    # tier's energy price.
    energy_j = models.PositiveBigIntegerField(null=True, blank=True)
    energy_charge = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["bid", "tier"], name="allocation_unique_bid_tier"),
            models.CheckConstraint(condition=Q(gpus__gte=1), name="allocation_gpus_positive"),
            models.CheckConstraint(
                condition=Q(charge__gte=0), name="allocation_charge_not_negative"
            ),
        ]
        indexes = [models.Index(fields=["status", "ends_at"])]

    def __str__(self) -> str:
        return f"allocation {self.pk}: {self.gpus}x {self.tier.slug} for {self.tenant_id}"


class Reclaim(models.Model):
    """A won GPU its team left idle (market/services/reclaim.py): noticed, then, after the
    tier's grace, reclaimed for the rest of the window, its unused time refunded at the
    policy's rate, and offered to backfill."""

    class Status(models.TextChoices):
        NOTICED = "noticed", "Noticed idle"
        RECLAIMED = "reclaimed", "Reclaimed"
        # Work came back (or the GPU became ineligible) before the grace ran out.
        WITHDRAWN = "withdrawn", "Withdrawn"

    OPEN = (Status.NOTICED, Status.RECLAIMED)

    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="reclaims")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="+")
    # The GPU, as in the allocation's placement.
    gpu_uuid = models.CharField(max_length=100)
    node = models.CharField(max_length=120)
    gpu_index = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.NOTICED)
    # Idle (utilisation below the tier's threshold) since then, as telemetry saw it.
    idle_since = models.DateTimeField()
    noticed_at = models.DateTimeField()
    # Reclaimed no earlier than this, if still idle: noticed_at + the tier's grace.
    reclaim_after = models.DateTimeField()
    reclaimed_at = models.DateTimeField(null=True, blank=True)
    # Milli-credits refunded (one ledger transfer, key ``reclaim:<id>``).
    refund = models.BigIntegerField(default=0)
    reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-noticed_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation", "gpu_uuid"],
                condition=Q(status__in=["noticed", "reclaimed"]),
                name="reclaim_one_open_per_gpu",
            ),
            models.CheckConstraint(condition=Q(refund__gte=0), name="reclaim_refund_not_negative"),
        ]
        indexes = [models.Index(fields=["status", "reclaim_after"])]

    def __str__(self) -> str:
        return (
            f"reclaim {self.pk}: {self.gpu_uuid} of allocation {self.allocation_id} ({self.status})"
        )


class Backfill(models.Model):
    """One backfill sub-round within a round's window (market/services/backfill.py): the GPUs
    nobody holds now (unsold, or reclaimed idle) offered to the standing orders that accept
    preemptible capacity, cleared by the round's policy, for the rest of the window."""

    round = models.ForeignKey(Round, on_delete=models.PROTECT, related_name="backfills")
    at = models.DateTimeField()
    # {tier slug: GPUs offered}, {tier slug: milli-credits per GPU-hour}, solver diagnostics.
    capacities = models.JSONField(default=dict, blank=True)
    prices = models.JSONField(default=dict, blank=True)
    diagnostics = models.JSONField(default=dict, blank=True)
    gpus_won = models.PositiveIntegerField(default=0)
    revenue = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["round", "at"], name="backfill_unique_round_at")
        ]

    def __str__(self) -> str:
        return f"backfill {self.pk} in round {self.round_id} at {self.at:%H:%M}"
