"""Valid agent batches to start tests from (docs/telemetry-protocol.md), and a poster."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

INGEST_URL = "/api/v1/telemetry/ingest"


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-TEST-{node}-{index}"


def batch(
    *,
    node: str = "n1",
    gpus: int = 2,
    ticks: int = 1,
    at: datetime | None = None,
    processes: dict[int, list[dict[str, Any]]] | None = None,
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A batch from node ``node`` with ``gpus`` GPUs and ``ticks`` samples per GPU, one second
    apart, ending at ``at`` (default now). ``processes`` maps a GPU index to its processes."""
    at = at or timezone.now()
    processes = processes or {}
    samples = [
        {
            "gpu": gpu_uuid(node, i),
            "at": (at - timedelta(seconds=ticks - 1 - t)).isoformat(),
            "utilization_pct": 40 + i,
            "memory_used_mib": 1000 * (i + 1),
            "memory_total_mib": 81920,
            "power_w": 150.5,
            "temperature_c": 55.0,
            "energy_j": 1000.0 * (t + 1),
            "processes": processes.get(i, []) if t == ticks - 1 else [],
        }
        for t in range(ticks)
        for i in range(gpus)
    ]
    return {
        "batch_id": str(uuid.uuid4()),
        "sent_at": timezone.now().isoformat(),
        "backend": "simulated",
        "agent_version": "0.1.0",
        "hostname": node,
        "gpus": [
            {"uuid": gpu_uuid(node, i), "index": i, "name": "Test GPU", "memory_total_mib": 81920}
            for i in range(gpus)
        ],
        "samples": samples,
        "directive_results": results or [],
    }


def process(
    pid: int,
    *,
    allocation: int | None = None,
    state: str = "running",
    launch_token: str | None = None,
) -> dict[str, Any]:
    return {
        "pid": pid,
        "memory_mib": 2048,
        "allocation": allocation,
        "slurm_job": None,
        "pod": None,
        "state": state,
        "launch_token": launch_token,
    }


def post(client: Client, token: str, body: dict[str, Any] | bytes | str):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post(
        INGEST_URL,
        data=data,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
