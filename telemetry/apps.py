from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "telemetry"
    verbose_name = "Telemetry and enforcement"

    def ready(self) -> None:
        # Placement (market) reads the GPUs the nodes report through this one door.
        from market.placement.inventory import inventory_register
        from telemetry.selectors import placeable_gpus

        inventory_register(placeable_gpus)
