from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "governance"
    verbose_name = "Governance: approvals and read-only roles"

    def ready(self) -> None:
        from governance.rules import approval_needed
        from tenants.approvals import approval_gate_register

        approval_gate_register(approval_needed)
