"""metrics.envy_count against its definition, one pair at a time: hand-checked cases, random
instances (hypothesis), and a larger one where most tenants sit near their threshold, so
that the bounds settle few of them and the exact pass over every bundle decides."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from market.clearing.outcome.metrics import ENVY_TOLERANCE, envy_count


def envy_simple(values, bundles, entitlement, demand) -> int:
    """The definition, pair by pair: i envies j when (eta_i / eta_j) min(1, D_i / |x_j|)
    v_i . x_j > v_i . x_i beyond the tolerance, for j with a bundle and an entitlement."""
    count = 0
    for i in range(values.shape[0]):
        if entitlement[i] <= 0:
            continue
        own = float(values[i] @ bundles[i])
        for j in range(values.shape[0]):
            size = bundles[j].sum()
            if entitlement[j] <= 0 or not bundles[j].any():
                continue
            scaled = entitlement[i] / entitlement[j] * min(1.0, demand[i] / size)
            if scaled * float(values[i] @ bundles[j]) > own * (1 + ENVY_TOLERANCE) + 1e-9:
                count += 1
                break
    return count


def arrays(values, bundles, entitlement, demand):
    return (
        np.asarray(values, dtype=float),
        np.asarray(bundles, dtype=float),
        np.asarray(entitlement, dtype=float),
        np.asarray(demand, dtype=float),
    )


def test_a_small_tenant_envies_only_what_it_could_use():
    # Tenant 0 values tier 1 at 3 and wants 2 GPUs; it holds 1 GPU of tier 0. Tenant 1's
    # 8 GPUs of tier 1 shrink to 2 for it: 6 > 1. Tenant 1 values its own tier most.
    case = arrays([[1, 3], [1, 2]], [[1, 0], [0, 8]], [1, 1], [2, 8])
    assert envy_count(*case) == envy_simple(*case) == 1


def test_entitlement_scales_the_other_bundle():
    # Same bundles, same values: with twice the entitlement, tenant 0 envies tenant 1's
    # bundle scaled by 2 (2 x 2 = 4 > 3); tenant 1 scales tenant 0's down (0.5 x 3 < 2).
    case = arrays([[1, 1], [1, 1]], [[3, 0], [0, 2]], [2, 1], [3, 2])
    assert envy_count(*case) == envy_simple(*case) == 1


def test_equal_bundles_and_no_holders_count_nothing():
    assert envy_count(*arrays([[2, 1], [2, 1]], [[1, 1], [1, 1]], [1, 1], [2, 2])) == 0
    assert envy_count(*arrays([[2, 1], [2, 1]], [[0, 0], [0, 0]], [1, 1], [2, 2])) == 0
    # A tenant without entitlement neither envies nor is envied.
    assert envy_count(*arrays([[5, 5], [1, 1]], [[0, 0], [4, 4]], [0, 1], [8, 8])) == 0


def test_within_the_tolerance_is_no_envy():
    # 1,000.5 GPUs against 1,000 is inside the 0.1 % tolerance; 1,002 is not.
    values, entitlement, demand = np.ones((2, 1)), np.ones(2), np.full(2, 2000.0)
    assert envy_count(values, np.array([[1000.0], [1000.5]]), entitlement, demand) == 0
    case = (values, np.array([[1000.0], [1002.0]]), entitlement, demand)
    assert envy_count(*case) == envy_simple(*case) == 1


@st.composite
def instances(draw):
    n = draw(st.integers(1, 14))
    t = draw(st.integers(1, 4))
    cells = st.integers(0, 9)
    values = draw(st.lists(st.lists(cells, min_size=t, max_size=t), min_size=n, max_size=n))
    gpus = st.integers(0, 6) if draw(st.booleans()) else st.sampled_from([0, 0, 0.5, 1.25, 3])
    bundles = draw(st.lists(st.lists(gpus, min_size=t, max_size=t), min_size=n, max_size=n))
    entitlement = draw(st.lists(st.sampled_from([0, 0.5, 1, 1, 2, 3]), min_size=n, max_size=n))
    extra = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    demand = [sum(b) + e if draw(st.booleans()) else e for b, e in zip(bundles, extra, strict=True)]
    return arrays(values, bundles, entitlement, demand)


@settings(max_examples=400, deadline=None)
@given(instances())
def test_equals_the_definition_on_random_instances(case):
    assert envy_count(*case) == envy_simple(*case)


def test_equals_the_definition_near_the_threshold():
    # 200 holders of mixed six-GPU bundles; 200 others hold six GPUs of a tier only they
    # value, priced within 0.5 % of the best holder's bundle to them. Their envy turns on
    # which mixed bundle is best, where the bounds from the per-tier maxima do not reach.
    rng = np.random.default_rng(7)
    h, o, t = 200, 200, 5
    values = rng.integers(1, 10, size=(h + o, t + 1)).astype(float)
    values[:h, t] = 0
    bundles = np.zeros((h + o, t + 1))
    bundles[:h, :t] = rng.multinomial(6, np.full(t, 1 / t), size=h)
    best = (values[h:, :t] @ bundles[:h, :t].T).max(axis=1)
    values[h:, t] = best / 6 * rng.uniform(0.995, 1.005, size=o)
    bundles[h:, t] = 6
    entitlement, demand = np.ones(h + o), np.full(h + o, 6.0)
    expected = envy_simple(values, bundles, entitlement, demand)
    assert 0 < expected < h + o
    assert envy_count(values, bundles, entitlement, demand) == expected
