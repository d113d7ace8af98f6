"""Every tenants write outside the ledger and budgets: tenants and memberships (``tenants``)
and personal API tokens (``tokens``)."""

from tenants.services.tenants import (
    member_add,
    member_create,
    member_remove,
    member_role_set,
    notifications_read,
    tenant_create,
    tenant_weight_set,
    username_check,
    weight_validate,
)
from tenants.services.tokens import (
    MAX_ACTIVE_TOKENS,
    IssuedToken,
    token_authenticate,
    token_create,
    token_revoke,
    tokens_of,
)

__all__ = [
    "MAX_ACTIVE_TOKENS",
    "IssuedToken",
    "member_add",
    "member_create",
    "member_remove",
    "member_role_set",
    "notifications_read",
    "tenant_create",
    "tenant_weight_set",
    "token_authenticate",
    "token_create",
    "token_revoke",
    "tokens_of",
    "username_check",
    "weight_validate",
]
