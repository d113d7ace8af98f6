"""Placement: which GPUs each allocation gets. Pure (no Django); the settlement and clearing
services feed it the GPUs of a tier that are free for the window.

Rules, in order:
- An allocation renewed by the same team on the same tier keeps the GPUs it had, if they are
  all still free and the count is unchanged (no needless moves).
- The rest, largest first (large gangs are the hardest to fit), best fit: the smallest NVLink
  domain with room for all of them; else the node with the least room that still fits them
  all, filling its fullest domains first (fewest domains crossed); else, for a gang (all its
  GPUs must run together), nothing — the caller clears the round again without it; for a
  divisible bid, the nodes with the most room first, so it is split into as few pieces as
  possible.
A GPU with no NVLink domain ("") is a domain of its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class FreeGpu:
    node: str
    index: int
    uuid: str
    domain: str = ""

    @property
    def group(self) -> tuple[str, str]:
        """(node, NVLink domain) — a GPU without a domain is its own group."""
        return (self.node, self.domain or f"solo:{self.uuid}")


@dataclass(frozen=True)
class Request:
    key: Hashable
    gpus: int
    gang: bool = False
    keep: tuple[str, ...] = ()  # GPU uuids it held in the previous window (a renewal)


@dataclass
class Placement:
    placed: dict[Hashable, tuple[FreeGpu, ...]] = field(default_factory=dict)
    unplaced: list[Hashable] = field(default_factory=list)
    free: list[FreeGpu] = field(default_factory=list)  # what is left

    def pieces(self, key: Hashable) -> int:
        """Nodes the allocation is spread over."""
        return len({g.node for g in self.placed.get(key, ())})


def largest_gang(free: Iterable[FreeGpu]) -> tuple[int, int]:
    """(largest gang that fits on one node, largest inside one NVLink domain) among ``free``:
    the tier's fragmentation as a user feels it."""
    nodes: dict[str, int] = defaultdict(int)
    groups: dict[tuple[str, str], int] = defaultdict(int)
    for gpu in free:
        nodes[gpu.node] += 1
        groups[gpu.group] += 1
    return max(nodes.values(), default=0), max(groups.values(), default=0)


def _take(gpus: list[FreeGpu], count: int) -> list[FreeGpu]:
    """``count`` GPUs of one node, from its fullest domains first."""
    by_group: dict[tuple[str, str], list[FreeGpu]] = defaultdict(list)
    for gpu in sorted(gpus):
        by_group[gpu.group].append(gpu)
    chosen: list[FreeGpu] = []
    for _, members in sorted(by_group.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        chosen += members[: count - len(chosen)]
        if len(chosen) == count:
            break
    return chosen


def _one(free: list[FreeGpu], count: int, gang: bool) -> list[FreeGpu] | None:
    groups: dict[tuple[str, str], list[FreeGpu]] = defaultdict(list)
    nodes: dict[str, list[FreeGpu]] = defaultdict(list)
    for gpu in free:
        groups[gpu.group].append(gpu)
        nodes[gpu.node].append(gpu)
    fits = [(len(m), g) for g, m in groups.items() if len(m) >= count]
    if fits:
        return sorted(groups[min(fits)[1]])[:count]
    fits_node = [(len(m), n) for n, m in nodes.items() if len(m) >= count]
    if fits_node:
        return _take(nodes[min(fits_node)[1]], count)
    if gang or sum(len(m) for m in nodes.values()) < count:
        return None
    chosen: list[FreeGpu] = []
    for _, node in sorted(((-len(m), n) for n, m in nodes.items())):
        chosen += _take(nodes[node], min(count - len(chosen), len(nodes[node])))
        if len(chosen) == count:
            break
    return chosen


def place(requests: Sequence[Request], free: Iterable[FreeGpu]) -> Placement:
    """Place every request on ``free`` GPUs (each GPU at most once); see the module docstring."""
    left = sorted(set(free))
    by_uuid = {g.uuid: g for g in left}
    result = Placement()
    rest: list[Request] = []
    for request in requests:
        kept = {by_uuid[u] for u in request.keep if u in by_uuid}
        if request.keep and len(request.keep) == request.gpus and kept <= set(left):
            if len(kept) == request.gpus:
                result.placed[request.key] = tuple(sorted(kept))
                left = [g for g in left if g not in kept]
                continue
        rest.append(request)
    for request in sorted(rest, key=lambda r: (-r.gpus, not r.gang, str(r.key))):
        chosen = _one(left, request.gpus, request.gang) if request.gpus > 0 else []
        if chosen is None:
            result.unplaced.append(request.key)
            continue
        result.placed[request.key] = tuple(sorted(chosen))
        taken = set(chosen)
        left = [g for g in left if g not in taken]
    result.free = left
    return result
