"""Every telemetry write: nodes and their tokens, ingest, tier capacity, node health, rollups.

``nodes`` registers nodes, checks and revokes their tokens and keeps tier capacity in step
with their GPUs; ``ingest`` stores agents' batches; ``upkeep`` holds the periodic node health
check and the sample rollup; ``enforcement`` is the enforcement loop (``enforce``), which
asks ``verdicts`` what each observed process may do.
"""

from telemetry.services.enforcement import EnforceReport, enforce
from telemetry.services.ingest import IngestResult, batch_refusal_record, samples_ingest
from telemetry.services.nodes import (
    gpu_maintenance_set,
    node_authenticate,
    node_register,
    node_token_revoke,
    tier_capacity_refresh,
)
from telemetry.services.upkeep import RollupResult, nodes_health_check, samples_rollup

__all__ = [
    "EnforceReport",
    "IngestResult",
    "RollupResult",
    "batch_refusal_record",
    "enforce",
    "gpu_maintenance_set",
    "node_authenticate",
    "node_register",
    "node_token_revoke",
    "nodes_health_check",
    "samples_ingest",
    "samples_rollup",
    "tier_capacity_refresh",
]
