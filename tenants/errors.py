from core.errors import DomainError


class TenantError(DomainError):
    """A tenant, ledger or budget operation was refused. The message says what to fix."""
