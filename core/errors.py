"""The root of every app's domain error (MarketError, TenantError, TelemetryError,
PlanningError).

A service refuses with its app's error and a message a person can act on. A web view catches
``DomainError`` around the service it calls, not only its own app's error, because a service
may pass on a refusal from a layer below it (a market service from the ledger, a telemetry
service from a tier's capacity), and that refusal must still reach the page as a form error or
a message, never as a 500 (tests/test_hostile_numbers.py walks every view that calls one).
"""

from __future__ import annotations


class DomainError(Exception):
    """A refusal with a message for the person who asked."""
