"""Credits as people type them: a point for decimals, commas only between thousands, bounded
before any arithmetic."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from tenants.forms import CreditsField


@pytest.mark.parametrize(
    ("typed", "milli"),
    [
        ("12", 12_000),
        ("12.5", 12_500),
        ("1,000", 1_000_000),
        ("1,000.125", 1_000_125),
        ("0.001", 1),
    ],
)
def test_credits_as_typed_become_milli_credits(typed, milli):
    assert CreditsField().clean(typed) == milli


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        ("12,5", "Use a point for decimals"),
        ("1,00", "Use a point for decimals"),
        ("1e30", "Enter at most 1,000,000,000,000 credits"),
        ("1E5000", "Enter at most 1,000,000,000,000 credits"),
        ("1e9999999", "Enter at most 1,000,000,000,000 credits"),
        ("9" * 5000, "Enter at most 1,000,000,000,000 credits"),
        ("5e-1", "without an exponent"),
        ("1e99999999", "Enter an amount in credits"),
        ("1e", "Enter an amount in credits"),
        ("2000000000000", "Enter at most 1,000,000,000,000 credits"),
        ("NaN", "Enter an amount in credits"),
        ("0.0001", "Enter an amount in credits"),
    ],
)
def test_hostile_amounts_are_refused_with_what_to_type(typed, words):
    with pytest.raises(ValidationError) as exc:
        CreditsField().clean(typed)
    assert words in " ".join(exc.value.messages)
