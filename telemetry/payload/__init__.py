"""Validation of one agent batch (docs/telemetry-protocol.md): ``payload_load`` (bytes ->
JSON, in ``load``) and ``payload_parse`` (JSON -> the records in ``reports``, in ``parse``)."""

from telemetry.payload.load import payload_load
from telemetry.payload.parse import payload_parse
from telemetry.payload.reports import BatchReport, Limits

__all__ = ["BatchReport", "Limits", "payload_load", "payload_parse"]
