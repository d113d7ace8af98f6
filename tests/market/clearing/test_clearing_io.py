"""JSON instances: parsing, refusals that name the field, and the CLI helper."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from market.clearing import ClearingError, clear
from market.clearing.instance.cli import main
from market.clearing.instance.io import instance_from_json, instance_to_json

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "instance.json"

GOOD = {
    "tiers": [{"name": "a100", "capacity": 4, "reserve_price": 1, "max_share": 1}],
    "tenants": [{"name": "lab", "weight": 1, "budget": None}],
    "bids": [
        {"id": "x", "tenant": "lab", "quantity": 2, "min_quantity": 0, "limits": {"a100": 3}},
        {"id": "y", "tenant": "lab", "quantity": 1, "min_quantity": 0, "limits": {"a100": 2}},
        {"id": "z", "tenant": "lab", "quantity": 1, "limits": {}},
        {"id": "w", "tenant": "lab", "quantity": 3, "limits": {"a100": 1}},
    ],
    "policy": {"name": "maxmin", "params": {"time_limit": 3}},
}


def test_good_instance_parses_with_defaults():
    data = copy.deepcopy(GOOD)
    del data["tiers"][0]["max_share"], data["tenants"][0]["weight"], data["policy"]
    instance, policy, params = instance_from_json(data)
    assert policy == "welfare"
    assert params == {"time_limit": 10.0}
    assert instance.tiers[0].max_share == 1.0
    assert instance.tenants[0].weight == 1.0
    assert instance.bids[0].limits == {"a100": 3}


def test_policy_and_params_come_from_the_file():
    _, policy, params = instance_from_json(GOOD)
    assert (policy, params) == ("maxmin", {"time_limit": 3, "values": None})


def edit(path: str, value: object) -> dict:
    """GOOD with one field replaced; value DELETE removes it."""
    data = copy.deepcopy(GOOD)
    *parents, last = path.split("/")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("bids/3/limits/a100", math.nan, "bids[3].limits.a100: price must be a finite number >= 0"),
        ("bids/3/limits/a100", math.inf, "bids[3].limits.a100: price must be a finite number >= 0"),
        ("bids/3/limits/a100", -1, "bids[3].limits.a100: price must be a finite number >= 0"),
        ("bids/3/limits/a100", "5", "bids[3].limits.a100: price must be a finite number"),
        ("bids/1/limits/h100", 5, "bids[1].limits.h100: unknown tier"),
        ("bids/0/tenant", "ghost", "bids[0].tenant: unknown tenant 'ghost'"),
        ("bids/0/quantity", -2, "bids[0].quantity: must be a number >= 1"),
        ("bids/0/quantity", 0, "bids[0].quantity: must be a number >= 1"),
        ("bids/0/quantity", True, "bids[0].quantity: must be a number >= 1"),
        ("bids/0/min_quantity", 3, "bids[0].min_quantity: 3 is more than quantity 2"),
        ("bids/1/id", "x", "bids[1].id: duplicate id 'x'"),
        ("bids/2/limits", [], "bids[2].limits: must be an object"),
        ("bids/0/id", DELETE, "bids[0].id: missing field"),
        ("bids/0/limits", DELETE, "bids[0].limits: missing field"),
        ("bids/0/colour", "red", "bids[0].colour: unknown field"),
        ("bids/0", "x", "bids[0]: must be an object"),
        ("tiers/0/capacity", 2.5, "tiers[0].capacity: must be a whole number of GPUs >= 0"),
        ("tiers/0/capacity", -1, "tiers[0].capacity: must be a whole number of GPUs >= 0"),
        ("tiers/0/capacity", DELETE, "tiers[0].capacity: missing field"),
        ("tiers/0/max_share", 0, "tiers[0].max_share: must be a number in (0, 1]"),
        ("tiers/0/max_share", 1.5, "tiers[0].max_share: must be a number in (0, 1]"),
        ("tiers/0/reserve_price", math.nan, "tiers[0].reserve_price: must be a finite number"),
        ("tiers/0/name", "", "tiers[0].name: must be a non-empty string"),
        ("tenants/0/weight", -1, "tenants[0].weight: must be a finite number >= 0"),
        ("tenants/0/budget", "lots", "tenants[0].budget: must be a finite number >= 0"),
        ("tenants/0/name", 7, "tenants[0].name: must be a non-empty string"),
        ("policy/name", "lottery", "policy.name: unknown mechanism 'lottery'"),
        ("policy/params", {"speed": 2}, "policy.params.speed: unknown parameter"),
        ("policy/params", {"time_limit": 0}, "policy.params.time_limit: must be a number"),
        ("bids", {}, "bids: must be a list"),
        ("tenants", DELETE, "tenants: missing field"),
    ],
)
def test_malformed_instance_names_the_field(path, value, message):
    with pytest.raises(ClearingError) as info:
        instance_from_json(edit(path, value))
    assert message in str(info.value)


def test_duplicate_tier_and_tenant_names_are_refused():
    data = copy.deepcopy(GOOD)
    data["tiers"].append(dict(data["tiers"][0]))
    with pytest.raises(ClearingError, match=r"tiers\[1\]\.name: duplicate name 'a100'"):
        instance_from_json(data)
    data = copy.deepcopy(GOOD)
    data["tenants"].append({"name": "lab"})
    with pytest.raises(ClearingError, match=r"tenants\[1\]\.name: duplicate name 'lab'"):
        instance_from_json(data)


def test_not_an_object_is_refused():
    with pytest.raises(ClearingError, match="instance: must be a JSON object"):
        instance_from_json([])


def test_values_parameter_is_checked():
    data = edit("policy/params", {"values": {"lab": {"h100": 3}}})
    _, policy, params = instance_from_json(data)
    instance, *_ = instance_from_json(data)
    with pytest.raises(ClearingError, match="policy.params.values.lab.h100: unknown tier"):
        clear(instance, mechanism=policy, params=params)


def test_example_instance_clears_under_every_policy():
    instance, policy, params = instance_from_json(json.loads(EXAMPLE.read_text()))
    for name in ("welfare", "fisher", "maxmin"):
        result = clear(instance, mechanism=name, params=params if name == policy else None)
        assert result.allocations


def test_cli_prints_the_result_json(capsys):
    assert main([str(EXAMPLE), "--policy", "fisher"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["allocations", "prices", "charges", "diagnostics"]
    assert out["diagnostics"]["mechanism"] == "fisher"


def test_cli_refuses_bad_input_on_stderr(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit("bids/0/tenant", "ghost")))
    assert main([str(bad)]) == 2
    assert "bids[0].tenant: unknown tenant 'ghost'" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main([str(broken)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_reserved_quotas_and_mixed_tiers_come_from_the_file(tmp_path, capsys):
    data = {
        "tiers": [{"name": "a100", "capacity": 10, "reserve_price": 1}],
        "tenants": [{"name": "rich"}, {"name": "small"}],
        "bids": [
            {"id": "r", "tenant": "rich", "quantity": 10, "limits": {"a100": 100}},
            {"id": "s", "tenant": "small", "quantity": 6, "limits": {"a100": 3}},
            {
                "id": "g",
                "tenant": "small",
                "quantity": 2,
                "min_quantity": 2,
                "mixed_tiers": True,
                "limits": {"a100": 1},
            },
        ],
        "reserved_quotas": "by_weight",
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {a["bid"]: a["gpus"] for a in out["allocations"]}
    assert got == {"r": 5, "s": 5}  # the per-tier split by weight, set aside first
    data["reserved_quotas"] = {"small": {"h100": 1}}
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 2
    assert "reserved_quotas.small.h100: unknown tier" in capsys.readouterr().err
    data["reserved_quotas"] = {}
    data["bids"][2]["mixed_tiers"] = "yes"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 2
    assert "bids[2].mixed_tiers: must be true or false" in capsys.readouterr().err


def test_the_old_quotas_key_is_refused_naming_reserved_quotas():
    data = {
        "tiers": [{"name": "a100", "capacity": 4}],
        "tenants": [{"name": "x"}],
        "bids": [{"id": "b", "tenant": "x", "quantity": 1, "limits": {"a100": 2}}],
        "quotas": "by_weight",
    }
    with pytest.raises(ClearingError, match=r'^quotas: renamed; write "reserved_quotas"'):
        instance_from_json(data)
    data["reserved_quotas"] = data.pop("quotas")
    instance, _, _ = instance_from_json(data)
    assert instance.reserved_quotas == "by_weight"
    assert instance_to_json(instance)["reserved_quotas"] == "by_weight"
