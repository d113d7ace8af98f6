"""Alerts that leave the app: the notifications teams already see, sent by email and to
webhooks as one digest per recipient per run (docs/alerts.md)."""
