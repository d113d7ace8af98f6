"""Slurm reservation names carry the platform's prefix (GPUMARKET_SLURM_RESERVATION_PREFIX),
so two platforms on one cluster, or a test run beside a platform, never touch each other's."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from market.services.slurm_reservations import reservation_name


def test_reservation_names_carry_the_sites_prefix(settings):
    assert reservation_name(12) == "gm-12"  # the default

    settings.GPUMARKET_SLURM_RESERVATION_PREFIX = "lab2-gm-"

    assert reservation_name(12) == "lab2-gm-12"


@pytest.mark.parametrize("prefix", ["", "-gm-", "gm 2-", "g" * 60])
def test_a_prefix_slurm_would_not_take_is_refused(settings, prefix):
    settings.GPUMARKET_SLURM_RESERVATION_PREFIX = prefix
    with pytest.raises(ImproperlyConfigured, match="GPUMARKET_SLURM_RESERVATION_PREFIX"):
        reservation_name(12)
