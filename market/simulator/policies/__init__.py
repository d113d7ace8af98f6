"""Every policy the simulator can replay, by the name the command line accepts.

Ours: the platform's three market mechanisms. Baselines: Gavel's max-min fairness and
max-sum throughput, Themis-style finish-time fairness, FIFO and a Slurm-style fair-share
queue. ``fcfs`` is kept as another name for ``fifo``.
"""

from __future__ import annotations

from market.simulator.policies.base import (
    BASE_PRICE,
    Fractions,
    Plan,
    PolicySpec,
    Tiers,
    View,
    equal_share_fractions,
    equal_share_rate,
    limit_prices,
)
from market.simulator.policies.ftf import FinishTimeFairness
from market.simulator.policies.gavel import max_min_fairness, max_sum_throughput
from market.simulator.policies.market import mechanism
from market.simulator.policies.queues import fair_share, fifo

_SPECS = [
    PolicySpec(name="welfare", make=lambda: mechanism("welfare"), market=True),
    PolicySpec(name="fisher", make=lambda: mechanism("fisher"), market=True),
    PolicySpec(name="maxmin", make=lambda: mechanism("maxmin"), market=True),
    PolicySpec(name="gavel-maxmin", make=lambda: max_min_fairness),
    PolicySpec(name="gavel-maxsum", make=lambda: max_sum_throughput),
    PolicySpec(name="ftf", make=FinishTimeFairness),
    PolicySpec(name="fifo", make=lambda: fifo, every_round=True),
    PolicySpec(name="fairshare", make=lambda: fair_share, every_round=True),
]
POLICIES: dict[str, PolicySpec] = {s.name: s for s in _SPECS}
POLICIES["fcfs"] = PolicySpec(name="fcfs", make=lambda: fifo, every_round=True)
MARKET = tuple(s.name for s in _SPECS if s.market)
BASELINES = tuple(s.name for s in _SPECS if not s.market)

__all__ = [
    "BASELINES",
    "BASE_PRICE",
    "MARKET",
    "POLICIES",
    "Fractions",
    "Plan",
    "PolicySpec",
    "Tiers",
    "View",
    "equal_share_fractions",
    "equal_share_rate",
    "limit_prices",
]
