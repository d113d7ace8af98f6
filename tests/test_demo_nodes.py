"""The demo's node names are its own: two demos on one host never share a simulated node, so
neither's agent adopts (and pauses, or terminates) the other's work."""

from __future__ import annotations

from gpumarket import demo


def test_demo_node_names_follow_the_var_dir(tmp_path):
    first = demo.demo_nodes(tmp_path / "one")
    again = demo.demo_nodes(tmp_path / "one")
    other = demo.demo_nodes(tmp_path / "two")

    assert first == again
    assert {name for name, _, _ in first}.isdisjoint(name for name, _, _ in other)
    assert [(tier, gpus) for _, tier, gpus in first] == [(t, g) for _, t, g in demo.NODES]
    assert all(name.startswith("sim-node-") for name, _, _ in first)
