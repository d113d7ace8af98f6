"""How many parts a round is cleared in: the exact clear below the threshold, then at least
GPUMARKET_PARTITION_PARTS, and more as the round grows so no part passes
GPUMARKET_PARTITION_BIDS_PER_PART bids."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from market.services.partitioned import partition_parts


@pytest.mark.parametrize(
    ("bids", "parts"),
    [
        (99_999, 1),  # below the threshold: exact
        (100_000, 4),  # the minimum (25k bids a part)
        (120_001, 5),  # 4 parts would pass 30k bids each
        (1_000_000, 34),
    ],
)
def test_parts_grow_with_the_round(settings, bids, parts):
    settings.GPUMARKET_PARTITION_ABOVE_BIDS = 100_000
    settings.GPUMARKET_PARTITION_PARTS = 4
    settings.GPUMARKET_PARTITION_BIDS_PER_PART = 30_000
    assert partition_parts(bids) == parts


def test_a_part_size_below_one_bid_is_a_configuration_error(settings):
    settings.GPUMARKET_PARTITION_ABOVE_BIDS = 1
    settings.GPUMARKET_PARTITION_BIDS_PER_PART = 0
    with pytest.raises(ImproperlyConfigured, match="BIDS_PER_PART must be at least 1, got 0"):
        partition_parts(5)


@pytest.mark.parametrize(
    ("mechanism", "bids", "parts"),
    [
        ("welfare", 99_000, 1),  # a min-cost flow: 2 s at 100k bids, exact
        ("maxmin", 99_000, 4),  # its LP reached the 10 s time limit here: in parts
        ("fisher", 99_000, 4),
        ("maxmin", 39_999, 1),
        ("fisher", 40_000, 4),
    ],
)
def test_fisher_and_maxmin_are_cleared_in_parts_from_a_lower_threshold(
    settings, mechanism, bids, parts
):
    # The shipped defaults: a maxmin round of 99,000 bids, cleared exactly, ended in a
    # SolverError at the default 10 s time limit on a 2-core machine (docs/clearing.md),
    # which fails the round.
    from config import settings as shipped

    for name in (
        "GPUMARKET_PARTITION_ABOVE_BIDS",
        "GPUMARKET_PARTITION_FAIR_ABOVE_BIDS",
        "GPUMARKET_PARTITION_PARTS",
        "GPUMARKET_PARTITION_BIDS_PER_PART",
    ):
        setattr(settings, name, getattr(shipped, name, None))
    assert partition_parts(bids, mechanism=mechanism) == parts
