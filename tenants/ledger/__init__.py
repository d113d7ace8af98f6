"""The double-entry credit ledger: every write to a balance goes through here.

Amounts are integer milli-credits (1 credit = 1000). A transfer moves an amount from one
account to another and writes two entries summing to zero. Balance changes lock the two
account rows with ``select_for_update`` in primary-key order, so concurrent requests
serialise on the rows they touch and can never overdraw a tenant account; the database
check constraint is the last line behind that.
"""

from core.money import MILLI, credits

from .batch import TransferOrder, transfer_execute_many
from .reads import Balance, balance_get, ledger_verify
from .transfers import (
    MAX_AMOUNT,
    Move,
    amount_validate,
    credits_charge,
    credits_grant,
    credits_hold,
    credits_refund,
    credits_release,
    hold_accounts_lock,
    platform_account,
    tenant_accounts_create,
    transfer_execute,
)

__all__ = [
    "MAX_AMOUNT",
    "MILLI",
    "Balance",
    "Move",
    "TransferOrder",
    "amount_validate",
    "balance_get",
    "credits",
    "credits_charge",
    "credits_grant",
    "credits_hold",
    "credits_refund",
    "credits_release",
    "hold_accounts_lock",
    "ledger_verify",
    "platform_account",
    "tenant_accounts_create",
    "transfer_execute",
    "transfer_execute_many",
]
