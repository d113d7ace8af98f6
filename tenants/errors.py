class TenantError(Exception):
    """A tenant, ledger or budget operation was refused. The message says what to fix."""
