from __future__ import annotations

from core.errors import DomainError


class TelemetryError(DomainError):
    """A telemetry request was refused. The message says what to fix.

    ``errors`` maps a field of the request (``samples[3].power_w``) to what is wrong with it;
    ``status`` is the HTTP status the ingest endpoint answers with.
    """

    def __init__(
        self, message: str, *, errors: dict[str, list[str]] | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.errors = errors if errors is not None else {"non_field_errors": [message]}
        self.status = status
