"""The node agents' ingest endpoint in the OpenAPI schema.

Ingest is a plain Django view (see views.py: it parses its own body and authenticates nodes,
not users), so drf-spectacular cannot see it; this hook (SPECTACULAR_SETTINGS
["POSTPROCESSING_HOOKS"]) adds its operation, as docs/telemetry-protocol.md describes it,
with every status the view answers. Ingest errors keep their own shape,
``{"errors": {field: [messages]}}``, which the agent logs field by field.
"""

from __future__ import annotations

from typing import Any

INGEST_PATH = "/api/v1/telemetry/ingest"

_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TEXT = {"type": "string", "nullable": True}

COMPONENTS: dict[str, Any] = {
    "IngestGpu": {
        "type": "object",
        "required": ["uuid", "index", "name", "memory_total_mib"],
        "properties": {
            "uuid": {"type": "string", "description": "NVML UUID (GPU-...)."},
            "index": {"type": "integer", "minimum": 0},
            "name": {"type": "string"},
            "memory_total_mib": {"type": "integer", "minimum": 0},
        },
    },
    "IngestProcess": {
        "type": "object",
        "required": ["pid", "memory_mib", "state"],
        "properties": {
            "pid": {"type": "integer", "minimum": 1},
            "memory_mib": {"type": "integer", "minimum": 0},
            "allocation": {
                "type": "integer",
                "nullable": True,
                "description": "GPUMARKET_ALLOCATION.",
            },
            "slurm_job": _NULLABLE_TEXT,
            "pod": _NULLABLE_TEXT,
            "state": {"type": "string", "enum": ["running", "stopped"]},
        },
    },
    "IngestSample": {
        "type": "object",
        "required": [
            "gpu",
            "at",
            "utilization_pct",
            "memory_used_mib",
            "memory_total_mib",
            "power_w",
            "temperature_c",
            "energy_j",
        ],
        "properties": {
            "gpu": {"type": "string", "description": "UUID of one of the batch's gpus."},
            "at": _TIME,
            "utilization_pct": {"type": "integer", "minimum": 0, "maximum": 100},
            "memory_used_mib": {"type": "integer", "minimum": 0},
            "memory_total_mib": {"type": "integer", "minimum": 0},
            "power_w": {"type": "number", "minimum": 0},
            "temperature_c": {"type": "number"},
            "energy_j": {"type": "number", "minimum": 0, "description": "Cumulative counter."},
            "processes": {"type": "array", "items": {"$ref": "#/components/schemas/IngestProcess"}},
        },
    },
    "IngestBatch": {
        "type": "object",
        "required": ["batch_id", "sent_at", "backend", "hostname", "gpus", "samples"],
        "properties": {
            "batch_id": {"type": "string", "format": "uuid"},
            "sent_at": _TIME,
            "backend": {"type": "string", "enum": ["nvml", "simulated"]},
            "agent_version": {"type": "string"},
            "hostname": {"type": "string"},
            "gpus": {"type": "array", "items": {"$ref": "#/components/schemas/IngestGpu"}},
            "samples": {"type": "array", "items": {"$ref": "#/components/schemas/IngestSample"}},
            "directive_results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "outcome"],
                    "properties": {
                        "id": {"type": "integer"},
                        "outcome": {"type": "string", "enum": ["done", "gone", "failed"]},
                        "detail": {"type": "string"},
                    },
                },
            },
        },
    },
    "IngestDirective": {
        "type": "object",
        "required": ["id", "action", "grace_seconds", "reason"],
        "properties": {
            "id": {"type": "integer"},
            "action": {"type": "string", "enum": ["pause", "resume", "terminate"]},
            "gpu": _NULLABLE_TEXT,
            "pid": {"type": "integer", "nullable": True},
            "allocation": {"type": "integer", "nullable": True},
            "slurm_job": _NULLABLE_TEXT,
            "pod": _NULLABLE_TEXT,
            "namespace": _NULLABLE_TEXT,
            "grace_seconds": {"type": "integer", "minimum": 0},
            "reason": {"type": "string"},
        },
    },
    "IngestResult": {
        "type": "object",
        "required": ["stored", "duplicate", "directives"],
        "properties": {
            "stored": {"type": "integer", "minimum": 0},
            "duplicate": {"type": "boolean", "description": "This batch_id was already stored."},
            "directives": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/IngestDirective"},
            },
        },
    },
    "IngestErrors": {
        "type": "object",
        "required": ["errors"],
        "properties": {
            "errors": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
                "description": "Messages per field, e.g. samples[3].power_w.",
            }
        },
    },
}

_REFUSALS = {
    "400": "The batch is invalid; nothing was stored. The agent drops it.",
    "401": "No node token, or it is unknown or revoked.",
    "403": "The batch names GPUs that belong to another node.",
    "405": "Only POST.",
    "409": "The batch_id was reused for a different batch.",
    "413": "The body is larger than GPUMARKET_INGEST_MAX_BYTES.",
    "415": "The body must be application/json.",
    "429": "The node posts faster than GPUMARKET_INGEST_RATE_PER_MINUTE; retry after Retry-After.",
}


def _errors(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestErrors"}}},
    }


OPERATION: dict[str, Any] = {
    "operationId": "telemetry_ingest",
    "summary": "Node agents post a batch of GPU samples; the answer carries directives",
    "description": "See docs/telemetry-protocol.md. Authenticates with the node's token "
    "(Authorization: Bearer <node token>), not a user's.",
    "tags": ["telemetry"],
    "security": [{"nodeToken": []}],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
    },
    "responses": {
        "200": {
            "description": "Stored (or a repeat of a stored batch); apply the directives.",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/IngestResult"}}
            },
        },
        **{code: _errors(text) for code, text in _REFUSALS.items()},
    },
}


def ingest_schema_append(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(COMPONENTS)
    components.setdefault("securitySchemes", {})["nodeToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "A node token, issued when the node is registered (gpumarket node-register).",
    }
    result.setdefault("paths", {})[INGEST_PATH] = {"post": OPERATION}
    return result
