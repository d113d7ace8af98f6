"""Reading traces and throughputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from market.simulator import SimulationError, throughputs_load, trace_load
from market.simulator.trace import throughput_for

DATA = Path(__file__).parent / "data"
TYPES = ["k80", "p100", "v100"]


@pytest.fixture(scope="module")
def table():
    return throughputs_load(DATA / "simulation_throughputs.json")


def test_trace_load_reads_type_steps_arrival_and_scale(table):
    jobs = trace_load(
        DATA / "head40.trace", throughputs=table, gpu_types=TYPES, tenants=3, max_jobs=2
    )
    first, second = jobs
    assert (first.job_type, first.steps, first.arrival, first.scale) == (
        "Transformer (batch size 128)",
        5352613,
        0.0,
        4,
    )
    assert (second.job_type, second.steps, second.arrival, second.scale) == (
        "Recommendation (batch size 8192)",
        557847,
        1456.0,
        4,
    )
    assert first.throughput["v100"] == pytest.approx(
        table["v100"][("Transformer (batch size 128)", 4)]
    )
    assert not first.extrapolated


def test_tenant_assignment_is_seeded(table):
    def tenants(seed):
        jobs = trace_load(
            DATA / "head40.trace", throughputs=table, gpu_types=TYPES, tenants=4, seed=seed
        )
        return [j.tenant for j in jobs]

    assert tenants(7) == tenants(7)
    assert tenants(7) != tenants(8)
    assert set(tenants(7)) == {0, 1, 2, 3}


def test_missing_gang_size_is_scaled_from_the_largest_smaller_one(table):
    # The table measures CycleGAN only on one GPU.
    value, extrapolated = throughput_for(table, "v100", "CycleGAN", 8)
    assert extrapolated
    assert value == pytest.approx(table["v100"][("CycleGAN", 1)] * 8)
    exact, guessed = throughput_for(table, "v100", "ResNet-18 (batch size 32)", 2)
    assert not guessed and exact == table["v100"][("ResNet-18 (batch size 32)", 2)]


def test_unknown_gpu_type_is_refused_with_the_known_ones(table):
    with pytest.raises(SimulationError, match=r"'h100'.*k80"):
        throughput_for(table, "h100", "CycleGAN", 1)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("A3C\tcmd\t-n\t1\t100\t0.0\n", "expected 7 tab-separated fields, found 6"),
        ("A3C\tcmd\t-n\t1\tmany\t0.0\t1\n", "must be numbers"),
        ("A3C\tcmd\t-n\t1\t100\t0.0\t0\n", "must be positive"),
    ],
)
def test_bad_trace_lines_name_the_line(tmp_path, table, line, message):
    trace = tmp_path / "bad.trace"
    trace.write_text("A3C\tcmd\t-n\t1\t100\t0.0\t1\n" + line)
    with pytest.raises(SimulationError, match=rf"bad.trace:2: .*{message}"):
        trace_load(trace, throughputs=table, gpu_types=TYPES, tenants=2)


def test_missing_files_are_named(tmp_path, table):
    with pytest.raises(SimulationError, match="does not exist"):
        trace_load(tmp_path / "nope.trace", throughputs=table, gpu_types=TYPES, tenants=2)
    with pytest.raises(SimulationError, match="does not exist"):
        throughputs_load(tmp_path / "nope.json")


def test_tenants_jobs_gives_every_job_its_own_tenant(table):
    jobs = trace_load(DATA / "head40.trace", throughputs=table, gpu_types=TYPES, tenants="jobs")
    assert len(jobs) == 40
    assert sorted(j.tenant for j in jobs) == list(range(40))
    # A seeded draw over as many tenants as jobs leaves some tenants with several jobs.
    drawn = trace_load(DATA / "head40.trace", throughputs=table, gpu_types=TYPES, tenants=40)
    assert len({j.tenant for j in drawn}) < 40
