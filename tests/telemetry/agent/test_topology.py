"""GPU topology: NVLink domains and PCIe switches, from pure link data, from NVML (the real
nvidia-ml-py module with its device calls answered as a driver would, since no GPU is here),
and the simulated node's."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from telemetry.agent.topology import (
    nvlink_domains,
    nvml_topology,
    pcie_switches,
    simulated_topology,
)


def test_direct_links_and_an_nvswitch_make_domains_and_a_gpu_without_links_has_none():
    buses = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"]
    links = {
        # GPUs 0 and 1 bridged directly; 2 and 3 through a switch that is not a GPU.
        buses[0]: [buses[1]],
        buses[1]: [buses[0]],
        buses[2]: ["0000:80:00.0"],
        buses[3]: ["0000:80:00.0"],
    }
    assert nvlink_domains(buses, links) == ["nvl0", "nvl0", "nvl2", "nvl2", ""]


def test_pcie_switches_group_gpus_without_a_host_bridge_between_them():
    switch = {0: 0, 1: 0, 2: 1, 3: 1}

    def ancestor(i, j):
        if switch[i] == switch[j]:
            return pynvml.NVML_TOPOLOGY_SINGLE
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE

    assert pcie_switches(4, ancestor) == ["pcie0", "pcie0", "pcie2", "pcie2"]


def test_simulated_nodes_split_into_equal_islands():
    assert simulated_topology(4, 2) == [
        ("nvl0", "pcie0"),
        ("nvl0", "pcie0"),
        ("nvl2", "pcie2"),
        ("nvl2", "pcie2"),
    ]
    assert [d for d, _ in simulated_topology(5, 2)] == ["nvl0", "nvl0", "nvl0", "nvl3", "nvl3"]
    assert {d for d, _ in simulated_topology(3, 1)} == {"nvl0"}
    with pytest.raises(ValueError, match="at least one NVLink island"):
        simulated_topology(4, 0)


@pytest.fixture
def driver(monkeypatch):
    """An 8-GPU box: GPUs 0-3 on one NVSwitch, 4-7 on another; 0-3 behind PCIe switch A and
    4-7 behind B; GPU 7's links are all down. Links past the sixth do not exist."""
    handles = [SimpleNamespace(index=i) for i in range(8)]
    bus = {i: f"0000:{0x10 + i:02X}:00.0".encode() for i in range(8)}

    def link_state(handle, link):
        if link >= 6:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_DISABLED if handle.index == 7 else pynvml.NVML_FEATURE_ENABLED

    def remote(handle, link):
        return SimpleNamespace(busId=b"0000:A0:00.0" if handle.index < 4 else b"0000:B0:00.0")

    def ancestor(a, b):
        same = (a.index < 4) == (b.index < 4)
        return pynvml.NVML_TOPOLOGY_MULTIPLE if same else pynvml.NVML_TOPOLOGY_SYSTEM

    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=bus[h.index])
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", link_state)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", remote)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTopologyCommonAncestor", ancestor)
    return handles


def test_nvml_topology_reads_links_through_switches_and_the_pcie_tree(driver):
    topology = nvml_topology(driver)
    assert [d for d, _ in topology] == ["nvl0"] * 4 + ["nvl4"] * 3 + [""]
    assert [p for _, p in topology] == ["pcie0"] * 4 + ["pcie4"] * 4


def test_a_driver_without_topology_support_leaves_every_gpu_alone(driver, monkeypatch):
    def unsupported(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", unsupported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTopologyCommonAncestor", unsupported)
    topology = nvml_topology(driver)
    assert [d for d, _ in topology] == [""] * 8
    assert [p for _, p in topology] == [f"pcie{i}" for i in range(8)]
