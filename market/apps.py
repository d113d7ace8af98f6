from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    verbose_name = "Market"

    def ready(self) -> None:
        from market.selectors import hard_cap_blocked_teams
        from tenants.overview import hard_cap_blocks_register

        hard_cap_blocks_register(hard_cap_blocked_teams)
