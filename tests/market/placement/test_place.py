"""Placement on its own: gangs on one node and one NVLink domain when possible, best fit,
renewals keep their GPUs, no GPU twice, the fragmentation figure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from market.placement import FreeGpu, Request, largest_gang, place


def node(name: str, gpus: int = 8, islands: int = 2) -> list[FreeGpu]:
    size = gpus // islands
    return [FreeGpu(name, i, f"{name}-{i}", f"nvl{(i // size) * size}") for i in range(gpus)]


def test_a_gang_lands_in_one_nvlink_domain_and_best_fit_keeps_room_for_a_big_one():
    free = node("n1") + node("n2")
    # 4 fits one domain; best fit picks the smallest room that fits, so n1's first island.
    result = place([Request("a", 4, gang=True)], free)
    gpus = result.placed["a"]
    assert len({(g.node, g.domain) for g in gpus}) == 1
    # An 8-GPU gang after it still finds a whole node.
    after = place([Request("b", 8, gang=True)], result.free)
    assert after.unplaced == [] and len({g.node for g in after.placed["b"]}) == 1


def test_small_jobs_fill_a_partly_used_domain_before_breaking_a_fresh_one():
    free = node("n1")[1:] + node("n2")  # n1's first island has 3 free
    result = place([Request("x", 2)], free)
    assert {g.uuid for g in result.placed["x"]} <= {"n1-1", "n1-2", "n1-3"}
    assert largest_gang(result.free) == (8, 4)


def test_a_gang_bigger_than_any_node_is_unplaced_and_a_divisible_bid_is_split_in_few_pieces():
    free = node("n1", 4) + node("n2", 4) + node("n3", 2, islands=1)
    result = place([Request("gang", 6, gang=True), Request("split", 6)], free)
    assert result.unplaced == ["gang"]
    assert result.pieces("split") == 2
    assert {g.node for g in result.placed["split"]} == {"n1", "n2"}


def test_a_renewal_keeps_its_gpus_and_others_go_around_them():
    free = node("n1", 4)
    kept = ("n1-2", "n1-3")
    result = place([Request("new", 2, gang=True), Request("renewed", 2, keep=kept)], free)
    assert tuple(g.uuid for g in result.placed["renewed"]) == kept
    assert {g.uuid for g in result.placed["new"]} == {"n1-0", "n1-1"}


def test_a_renewal_whose_gpus_went_away_is_placed_afresh():
    free = [g for g in node("n1", 4) if g.uuid != "n1-3"]
    result = place([Request("renewed", 2, keep=("n1-2", "n1-3"))], free)
    assert len(result.placed["renewed"]) == 2


def test_gpus_without_a_domain_count_one_by_one():
    free = [FreeGpu("n1", i, f"n1-{i}") for i in range(4)]
    result = place([Request("g", 3, gang=True)], free)
    assert result.pieces("g") == 1 and largest_gang(result.free) == (1, 1)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=5),
    asks=st.lists(st.tuples(st.integers(1, 8), st.booleans()), min_size=1, max_size=8),
)
def test_no_gpu_is_placed_twice_and_everything_placed_is_whole(nodes, asks):
    free = [g for i, n in enumerate(nodes) for g in node(f"n{i}", n, islands=1 if n < 2 else 2)]
    requests = [Request(k, gpus, gang) for k, (gpus, gang) in enumerate(asks)]
    result = place(requests, free)
    used = [g.uuid for gpus in result.placed.values() for g in gpus]
    assert len(used) == len(set(used))
    assert set(used) | {g.uuid for g in result.free} == {g.uuid for g in free}
    for request in requests:
        if request.key in result.placed:
            assert len(result.placed[request.key]) == request.gpus
            if request.gang:
                assert result.pieces(request.key) == 1
        else:
            assert request.key in result.unplaced
    # A divisible request is unplaced only when too few GPUs were left for it.
    total = len(free)
    if sum(r.gpus for r in requests) <= total:
        assert all(requests[k].gang for k in result.unplaced)
