"""Money in the API: credits written as a decimal string, milli-credits inside.

Every amount the API sends is a string with exactly three decimals ("12.500", "-0.250"); every
amount it takes is a string of credits with at most three decimals ("12.5", "0.001"). A string,
not a JSON number: a number passes through binary floating point in most clients, and a price
of 0.1 credits should not arrive as 0.1000000000000000055. The schema gives each field a
pattern, and the server accepts exactly the strings the pattern matches (the same expression
is used for both), so a client that validates against the schema is never surprised.
"""

from __future__ import annotations

import re
from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.ledger import MILLI

# Sent: a sign for a debit, whole credits without grouping, always three decimals.
SENT_PATTERN = r"^-?\d+\.\d{3}$"


def credits_text(milli: int) -> str:
    """12345 -> "12.345"; -250 -> "-0.250". No thousands separators: a machine reads this."""
    sign = "-" if milli < 0 else ""
    whole, frac = divmod(abs(int(milli)), MILLI)
    return f"{sign}{whole}.{frac:03d}"


def positive_pattern(most_credits: int) -> str:
    """A pattern for credits greater than zero and at most ``most_credits`` (a power of ten),
    with at most three decimals and no leading zeros, sign, exponent or grouping."""
    digits = len(str(most_credits)) - 1
    if most_credits != 10**digits or digits < 1:
        raise ValueError("most_credits must be a power of ten, at least 10")
    below = rf"[1-9]\d{{0,{digits - 1}}}(?:\.\d{{1,3}})?"
    fraction = r"0\.(?:[1-9]\d{0,2}|0[1-9]\d?|00[1-9])"
    at_most = rf"{most_credits}(?:\.0{{1,3}})?"
    return rf"^(?:{below}|{fraction}|{at_most})$"


@extend_schema_field(
    {
        "type": "string",
        "format": "decimal",
        "pattern": SENT_PATTERN,
        "example": "12.500",
        "description": "Credits, three decimals (1 credit = 1000 milli-credits).",
    }
)
class CreditsField(serializers.Field):
    """An amount the API sends (read-only): integer milli-credits out as "12.345"."""

    def __init__(self, **kwargs) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: int) -> str:
        return credits_text(value)


class CreditsInputField(serializers.Field):
    """An amount the API takes: a string of credits in (0, most_credits], milli-credits out.

    Subclasses fix the bound, because the schema pattern that states it is per class.
    """

    most_credits = 10**6
    default_error_messages = {
        "invalid": "must be credits as a string with at most three decimals, greater than 0 "
        'and at most {most}, e.g. "12.5" (no exponent, sign or thousands separator)',
    }

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._pattern = re.compile(positive_pattern(self.most_credits))

    def to_internal_value(self, data: object) -> int:
        # re.search with ^...$, as a JSON Schema validator applies the pattern: "$" also
        # matches before one final newline, so such a string is valid by the schema too.
        if type(data) is not str or self._pattern.search(data) is None:
            self.fail("invalid", most=f"{self.most_credits:,}")
        return int(Decimal(data.rstrip("\n")) * MILLI)

    def to_representation(self, value: int) -> str:
        return credits_text(value)
