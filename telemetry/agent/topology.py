"""Which GPUs of a node share an NVLink domain and which share a PCIe switch.

Placement puts a multi-GPU job inside one NVLink domain where it fits, since NVLink moves data
between GPUs an order of magnitude faster than PCIe. The grouping is pure (``nvlink_domains``,
``pcie_switches``); ``nvml_topology`` reads the links and the PCIe tree from NVML, and any part
NVML does not support leaves the GPU in no domain ("") rather than failing the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pynvml

logger = logging.getLogger(__name__)


def _find(parent: dict[str, str], item: str) -> str:
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def nvlink_domains(buses: Sequence[str], links: Mapping[str, Sequence[str]]) -> list[str]:
    """Per GPU (by PCI bus id, in order), the label of its NVLink domain: GPUs joined by
    active links, directly or through NVSwitches (any bus id that is not a GPU), share one.
    The label is "nvl<lowest GPU index in the domain>"; a GPU with no active link gets "".
    """
    parent = {bus: bus for bus in buses}
    for bus, remotes in links.items():
        for remote in remotes:
            parent.setdefault(remote, remote)
            parent.setdefault(bus, bus)
            a, b = _find(parent, bus), _find(parent, remote)
            if a != b:
                parent[max(a, b)] = min(a, b)
    first: dict[str, int] = {}
    for index, bus in enumerate(buses):
        first.setdefault(_find(parent, bus), index)
    return [f"nvl{first[_find(parent, bus)]}" if links.get(bus) else "" for bus in buses]


def pcie_switches(count: int, ancestor: Callable[[int, int], int]) -> list[str]:
    """Per GPU, "pcie<lowest index>" of the GPUs behind the same PCIe switch tree as it (NVML
    common ancestor at most NVML_TOPOLOGY_MULTIPLE: no host bridge between them)."""
    labels = [""] * count
    for i in range(count):
        if labels[i]:
            continue
        labels[i] = f"pcie{i}"
        for j in range(i + 1, count):
            if not labels[j] and ancestor(i, j) <= pynvml.NVML_TOPOLOGY_MULTIPLE:
                labels[j] = labels[i]
    return labels


def nvml_topology(handles: Sequence[Any]) -> list[tuple[str, str]]:
    """(NVLink domain, PCIe switch) per GPU, read from NVML; ("", "") where it cannot tell."""
    try:
        buses = [_bus(pynvml.nvmlDeviceGetPciInfo(h)) for h in handles]
    except pynvml.NVMLError as exc:
        logger.warning("NVML gave no PCI bus ids, so no GPU topology: %s", exc)
        return [("", "")] * len(handles)
    links: dict[str, list[str]] = {}
    for bus, handle in zip(buses, handles, strict=True):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
            except pynvml.NVMLError:
                break  # no such link (or no NVLink at all): the rest are absent too
            links.setdefault(bus, []).append(remote)
    domains = nvlink_domains(buses, links)

    def ancestor(i: int, j: int) -> int:
        try:
            return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
        except pynvml.NVMLError:
            return pynvml.NVML_TOPOLOGY_SYSTEM

    return list(zip(domains, pcie_switches(len(handles), ancestor), strict=True))


def _bus(info: Any) -> str:
    bus = info.busId
    return (bus.decode() if isinstance(bus, bytes) else str(bus)).lower()


def simulated_topology(gpus: int, islands: int) -> list[tuple[str, str]]:
    """A simulated node's topology: ``islands`` NVLink islands of equal size (the last may be
    smaller), each behind its own PCIe switch."""
    if islands < 1:
        raise ValueError("a simulated node needs at least one NVLink island")
    size = -(-gpus // min(islands, gpus))
    return [(f"nvl{(i // size) * size}", f"pcie{(i // size) * size}") for i in range(gpus)]
