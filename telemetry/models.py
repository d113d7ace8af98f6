"""Nodes, their GPUs, what the GPUs report, and the directives the platform sends back.

Units are in the field names: MiB, W (watts), degrees C, J (joules), percent.
"""

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Index, Q


class BrinIndexOnPostgres(BrinIndex):
    """BRIN on PostgreSQL; a plain index on the embedded demo's SQLite, which has no BRIN."""

    def create_sql(self, model, schema_editor, using="", **kwargs):
        if schema_editor.connection.vendor != "postgresql":
            return Index.create_sql(self, model, schema_editor, using=using, **kwargs)
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class Node(models.Model):
    """A machine running the agent. Its token is stored only as a SHA-256 hash."""

    class Backend(models.TextChoices):
        NVML = "nvml", "NVML"
        SIMULATED = "simulated", "Simulated"

    name = models.CharField(max_length=120, unique=True)
    # The tier that GPUs discovered on this node join.
    tier = models.ForeignKey("market.Tier", on_delete=models.PROTECT, related_name="nodes")
    # The token's public part, for lookup; the secret part is compared by hash only.
    token_prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    backend = models.CharField(max_length=20, choices=Backend.choices, blank=True)
    simulated = models.BooleanField(default=False)
    hostname = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    healthy = models.BooleanField(default=False)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Batches refused whole (after the node authenticated) and process claims dropped from
    # accepted batches, since the node was registered; the last refusal and when, for alerts.
    refused_batches = models.PositiveIntegerField(default=0)
    refused_fields = models.PositiveIntegerField(default=0)
    last_refusal = models.CharField(max_length=300, blank=True)
    last_refusal_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name + (" (simulated)" if self.simulated else "")

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    uuid = models.CharField(max_length=100, unique=True)
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=120)
    tier = models.ForeignKey("market.Tier", on_delete=models.PROTECT, related_name="gpus")
    memory_total_mib = models.PositiveIntegerField()
    # Topology as the agent reports it: GPUs of a node with the same nvlink_domain are joined
    # by NVLink; "" = none or not known. Placement keeps a gang inside one domain if it fits.
    nvlink_domain = models.CharField(max_length=64, blank=True)
    pcie_switch = models.CharField(max_length=64, blank=True)
    # Reported in the latest batch of a healthy node.
    healthy = models.BooleanField(default=True)
    # Out of the tier's capacity while true: set by an admin, or by telemetry when the GPU
    # reports a fatal error (``failure`` then says which).
    maintenance = models.BooleanField(default=False)
    # Why telemetry took the GPU out (an XID error, uncorrectable ECC errors, lost from the
    # bus) and the sample time it first showed; "" and null while it has not failed. An admin
    # clears both by taking the GPU out of maintenance.
    failure = models.CharField(max_length=300, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    # What NVML reported in the GPU's latest health reading: throttle reasons in force
    # (e.g. ["thermal", "power"]; not a failure), the last XID error code, and the
    # uncorrectable ECC error counts since the driver loaded (volatile) and ever (aggregate).
    throttle_reasons = models.JSONField(default=list, blank=True)
    xid_last = models.PositiveIntegerField(null=True, blank=True)
    ecc_volatile_uncorrected = models.PositiveBigIntegerField(default=0)
    ecc_aggregate_uncorrected = models.PositiveBigIntegerField(default=0)
    # Since when every minute's average power has been above its tier's power cap (null while
    # it keeps to it), and whether that lasted long enough to be a finding (audited, shown).
    over_power_cap_since = models.DateTimeField(null=True, blank=True)
    over_power_cap = models.BooleanField(default=False)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Sample time of the process list kept in ProcessObservation, so a late batch from an
    # agent's backlog never replaces a newer view of what runs on the GPU.
    processes_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node", "index"]
        indexes = [models.Index(fields=["tier", "healthy", "maintenance"])]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.uuid})"


class Sample(models.Model):
    """One raw reading of one GPU; dropped after GPUMARKET_SAMPLE_RETENTION_HOURS, once rolled
    up into SampleMinute."""

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="+", db_index=False)
    at = models.DateTimeField()
    utilization_pct = models.FloatField()
    memory_used_mib = models.IntegerField()
    memory_total_mib = models.IntegerField()
    power_w = models.FloatField()
    temperature_c = models.FloatField()
    # A cumulative counter (joules since the driver or agent started), not energy per sample.
    energy_j = models.FloatField()

    class Meta:
        indexes = [
            models.Index(fields=["gpu", "at"], name="sample_gpu_at"),
            # Samples arrive roughly in time order: a BRIN index serves the retention purge
            # and time-range scans for almost no cost on insert.
            BrinIndexOnPostgres(fields=["at"], name="sample_at_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.at:%H:%M:%S} {self.utilization_pct:.0f}%"


class SampleMinute(models.Model):
    """Per-GPU, per-minute aggregates of the raw samples; kept after the raw rows are gone."""

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="minutes")
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilization_avg = models.FloatField()
    utilization_max = models.FloatField()
    memory_used_avg = models.FloatField()
    memory_used_max = models.IntegerField()
    power_avg = models.FloatField()
    power_max = models.FloatField()
    temperature_max = models.FloatField()
    # The energy counter's highest reading in the minute: differences between minutes give
    # energy used (a drop means the counter was reset).
    energy_j_last = models.FloatField()
    # Joules used in the minute: the counter's rises from the sample before the minute on; a
    # reading below the one before it is a reset and counts from itself (never negative).
    energy_j = models.FloatField(default=0)

    class Meta:
        ordering = ["gpu", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "minute"], name="sampleminute_unique_gpu_minute")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} {self.minute:%Y-%m-%d %H:%M} {self.utilization_avg:.0f}%"


class IngestBatch(models.Model):
    """One accepted POST. The unique batch id makes a retried batch a no-op."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="batches")
    batch_id = models.UUIDField(unique=True)
    sent_at = models.DateTimeField()
    received_at = models.DateTimeField()
    samples = models.PositiveIntegerField()
    # Time range of the batch's samples (null when it carried none), for the minute rollup.
    first_at = models.DateTimeField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    rolled_up = models.BooleanField(default=False)

    class Meta:
        ordering = ["-received_at"]
        indexes = [
            models.Index(
                fields=["received_at"], condition=Q(rolled_up=False), name="ingestbatch_unrolled"
            )
        ]

    def __str__(self) -> str:
        return f"batch {self.batch_id} from {self.node_id}: {self.samples} samples"


class ProcessObservation(models.Model):
    """A compute process in the latest sample of its GPU: the enforcement loop's observed state."""

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        STOPPED = "stopped", "Stopped"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="processes")
    pid = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField()
    # The allocation id the process is tagged with, as the agent reported it: it may name no
    # allocation at all, which the enforcement loop treats as "not allowed to run".
    allocation_ref = models.BigIntegerField(null=True, blank=True)
    slurm_job = models.CharField(max_length=64, blank=True)
    pod = models.CharField(max_length=253, blank=True)
    # GPUMARKET_LAUNCH_TOKEN as the agent reported it: work of a placed allocation runs only
    # if it verifies (market/placement/launch.py).
    launch_token = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=10, choices=State.choices)
    # When the agent sampled it, and when the server received that sample.
    at = models.DateTimeField()
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["gpu", "pid"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "pid"], name="processobservation_unique_gpu_pid")
        ]

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.gpu_id} ({self.state})"


class EnforcementAction(models.Model):
    """A directive to a node's agent, with why it was issued and what became of it."""

    class Action(models.TextChoices):
        PAUSE = "pause", "Pause"
        RESUME = "resume", "Resume"
        TERMINATE = "terminate", "Terminate (preempt)"
        # A standing order's work whose order lost the round: checkpoint signal, grace, then
        # stopped (or requeued and held on Slurm) with its GPUs released; resumed on a win.
        SUSPEND = "suspend", "Suspend (order lost the round)"

    class State(models.TextChoices):
        ISSUED = "issued", "Issued"
        DELIVERED = "delivered", "Delivered to the agent"
        ACKNOWLEDGED = "acknowledged", "Carried out"
        FAILED = "failed", "Failed"
        GONE = "gone", "Process gone"

    PENDING_STATES = (State.ISSUED, State.DELIVERED)

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="actions")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="actions")
    pid = models.PositiveIntegerField()
    allocation = models.ForeignKey(
        "market.Allocation",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="enforcement_actions",
    )
    # The tag the process carried (sent back to the agent even when it names no allocation).
    allocation_ref = models.BigIntegerField(null=True, blank=True)
    tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="enforcement_actions",
    )
    slurm_job = models.CharField(max_length=64, blank=True)
    pod = models.CharField(max_length=253, blank=True)
    action = models.CharField(max_length=10, choices=Action.choices)
    reason = models.CharField(max_length=300)
    state = models.CharField(max_length=12, choices=State.choices, default=State.ISSUED)
    detail = models.CharField(max_length=500, blank=True)
    grace_seconds = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # When the agent's outcome (done, gone or failed) arrived.
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["node", "state"], name="action_node_state"),
            models.Index(fields=["gpu", "pid"], name="action_target"),
            models.Index(fields=["tenant", "-created_at"], name="action_tenant_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.action} pid {self.pid} on {self.gpu_id} ({self.state})"

    @property
    def pending(self) -> bool:
        return self.state in self.PENDING_STATES
