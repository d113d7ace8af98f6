"""``/metrics`` energy series: metered energy and its charges per tier, the tiers' power caps
and the GPUs drawing above them. Platform-wide per tier, like the rest of ``/metrics``; a
team's own figures are on its spend page, in its CSV export and in the allocations API."""

from __future__ import annotations

from django.db.models import Count, Sum

from market.models import Allocation, Tier
from telemetry.metrics import _Family
from telemetry.models import Gpu

JOULES_PER_KWH = 3_600_000


def energy_families() -> list[_Family]:
    energy = _Family(
        "gpumarket_energy_kwh_total",
        "counter",
        "Energy used by metered allocations (their GPUs, in their windows), kWh, by tier.",
    )
    charged = _Family(
        "gpumarket_energy_charge_millicredits_total",
        "counter",
        "Milli-credits charged for metered energy at the tiers' energy prices, by tier.",
    )
    for slug, joules, charge in (
        Allocation.objects.filter(energy_j__isnull=False)
        .values("tier__slug")
        .annotate(joules=Sum("energy_j"), charge=Sum("energy_charge"))
        .order_by("tier__slug")
        .values_list("tier__slug", "joules", "charge")
    ):
        energy.add((joules or 0) / JOULES_PER_KWH, tier=slug)
        charged.add(charge or 0, tier=slug)

    price = _Family(
        "gpumarket_tier_energy_price_millicredits",
        "gauge",
        "A tier's energy price, milli-credits per kWh (0: energy not charged).",
    )
    cap = _Family(
        "gpumarket_tier_power_cap_watts", "gauge", "A tier's power cap per GPU, watts (if set)."
    )
    for slug, energy_price, power_cap in (
        Tier.objects.filter(active=True)
        .order_by("slug")
        .values_list("slug", "energy_price", "power_cap_w")
    ):
        price.add(energy_price, tier=slug)
        if power_cap is not None:
            cap.add(power_cap, tier=slug)

    over = _Family(
        "gpumarket_gpus_over_power_cap",
        "gauge",
        "GPUs whose power stayed above their tier's cap for minutes (an enforcement finding).",
    )
    for slug, n in (
        Gpu.objects.filter(over_power_cap=True)
        .values("tier__slug")
        .annotate(n=Count("id"))
        .order_by("tier__slug")
        .values_list("tier__slug", "n")
    ):
        over.add(n, tier=slug)
    return [energy, charged, price, cap, over]
