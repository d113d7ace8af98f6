"""The alerts' Celery tasks: thin, by name (services queue them with send_task)."""

from __future__ import annotations

from celery import shared_task

from alerts.services import deliveries_resend, delivery_send, digest_run


@shared_task(name="alerts.digest")
def digest_task() -> dict:
    """Beat: the notices since the last run, one digest per recipient; then what is due."""
    report = digest_run()
    return {
        "notices": report.notices,
        "emails": report.emails,
        "webhooks": report.webhooks,
        "resent": deliveries_resend(),
    }


@shared_task(name="alerts.deliver", bind=True, max_retries=None)
def deliver_task(self, delivery_id: int) -> str:
    """Send one delivery; a failure is retried with a doubling delay (the row records each
    attempt) until GPUMARKET_ALERT_MAX_ATTEMPTS, then marked failed."""
    outcome = delivery_send(delivery_id=delivery_id)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.status
