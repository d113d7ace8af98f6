"""Hand-off of an allocation to the work that runs on it: which GPUs on which node, the
environment to start it with, and the launch token that binds it (market/placement/launch.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from market.errors import MarketError
from market.models import Allocation
from market.placement.launch import TOKEN_ENV, launch_token
from market.services._common import now_or

ALLOCATION_ENV = "GPUMARKET_ALLOCATION"


@dataclass(frozen=True)
class Launch:
    allocation: int
    node: str
    indices: tuple[int, ...]
    uuids: tuple[str, ...]
    token: str

    @property
    def env(self) -> dict[str, str]:
        """What ``gpumarket run`` adds to the command's environment."""
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in self.indices),
            ALLOCATION_ENV: str(self.allocation),
            TOKEN_ENV: self.token,
        }


def placement_by_node(allocation: Allocation) -> dict[str, list[int]]:
    """{node: [GPU indices]} of the allocation, nodes in name order."""
    nodes: dict[str, list[int]] = {}
    for gpu in sorted(allocation.placement, key=lambda g: (g["node"], g["index"])):
        nodes.setdefault(gpu["node"], []).append(int(gpu["index"]))
    return nodes


def placement_text(allocation: Allocation) -> str:
    """ "n0 GPUs 0, 1; n1 GPU 3" — or "" when not placed."""
    return "; ".join(
        f"{node} GPU{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
        for node, indices in placement_by_node(allocation).items()
    )


def ready_commands(allocation: Allocation, command: str = "python train.py") -> list[str]:
    """One ``gpumarket run`` per node the allocation is placed on."""
    return [
        f"gpumarket run --allocation {allocation.pk} --node {node} -- {command}"
        for node in placement_by_node(allocation)
    ]


def allocation_launch(*, allocation: Allocation, node: str, now: datetime | None = None) -> Launch:
    """What work on ``node`` needs to run on ``allocation`` (fetched through the caller's
    tenant). Raises MarketError saying why not: not active now, not placed, not on this node."""
    now = now_or(now)
    pk = allocation.pk
    if allocation.status != Allocation.Status.ACTIVE:
        raise MarketError(
            f"allocation {pk} is {allocation.get_status_display().lower()}, not active: "
            "there is nothing to launch on it"
        )
    if now < allocation.starts_at:
        raise MarketError(
            f"allocation {pk} starts at {allocation.starts_at:%Y-%m-%d %H:%M:%S} UTC; "
            "launch it then"
        )
    if now >= allocation.ends_at:
        raise MarketError(
            f"allocation {pk} ended at {allocation.ends_at:%Y-%m-%d %H:%M:%S} UTC; "
            "there is nothing to launch on it"
        )
    if not allocation.placement or not allocation.launch_secret:
        raise MarketError(
            f"allocation {pk} has no GPUs placed for it (no node reports its tier's GPUs); "
            f"tag the work with {ALLOCATION_ENV}={pk} instead"
        )
    mine = sorted((g for g in allocation.placement if g["node"] == node), key=lambda g: g["index"])
    if not mine:
        raise MarketError(
            f"allocation {pk} runs on {placement_text(allocation)}, not on node {node!r}: "
            "start the work there, or name the node with --node"
        )
    uuids = tuple(g["uuid"] for g in mine)
    return Launch(
        allocation=pk,
        node=node,
        indices=tuple(int(g["index"]) for g in mine),
        uuids=uuids,
        token=launch_token(
            secret=allocation.launch_secret, allocation_id=pk, node=node, uuids=uuids
        ),
    )
