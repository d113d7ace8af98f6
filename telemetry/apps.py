from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"
    verbose_name = "Telemetry and enforcement"
