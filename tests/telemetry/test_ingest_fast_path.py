"""The parser's fast path for plain samples (no processes, unreported work or health) gives
exactly what its field-by-field checks give: the same rows, or the same refusal naming the
same field with the same words."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from django.utils import timezone

from telemetry.errors import TelemetryError
from telemetry.payload import Limits, payload_parse
from tests.telemetry.batches import batch

LIMITS = Limits(
    clock_skew=timedelta(seconds=120),
    max_age=timedelta(hours=6),
    max_samples=10_000,
)
FIELDS = (
    "gpu",
    "at",
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
    "energy_j",
)
VALUES = (
    None,
    True,
    False,
    "1",
    "",
    [],
    {},
    [1],
    -1,
    -0.5,
    0,
    0.0,
    1,
    50.5,
    100,
    101,
    150.0,
    151,
    10_000.0,
    10_000.5,
    1e15,
    1.5e15,
    float("inf"),
    float("nan"),
    2**70,
    "GPU-TEST-n1-0",
    "2001-01-01T00:00:00+00:00",
)


def outcome(body):
    try:
        report = payload_parse(body, now=timezone.now(), limits=LIMITS)
    except TelemetryError as exc:
        return ("refused", exc.status, exc.errors)
    return ("stored", report.samples, report.processes, report.refused)


def slow(body):
    """The same batch with a process on every sample: only the field-by-field checks apply."""
    body = copy.deepcopy(body)
    for sample in body["samples"]:
        if type(sample) is dict:
            sample["processes"] = [{"pid": 7, "memory_mib": 1, "state": "running"}]
    return body


def strip_processes(result):
    if result[0] != "stored":
        return result
    return (result[0], result[1], {gpu: at for gpu, (at, _) in result[2].items()}, result[3])


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_fast_path_answers_as_the_field_checks_do(field, value):
    body = batch(gpus=2, ticks=2)
    body["samples"][1][field] = value
    assert strip_processes(outcome(body)) == strip_processes(outcome(slow(body)))


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.pop("energy_j"),
        lambda s: s.update(processes={}),
        lambda s: s.update(processes=""),
        lambda s: s.update(processes=0),
        lambda s: s.update(unreported={}),
        lambda s: s.update(unreported=0),
        lambda s: s.update(health=[]),
        lambda s: s.update(health={"lost": "yes"}),
    ],
    ids=[
        "missing",
        "processes {}",
        "processes ''",
        "processes 0",
        "unreported {}",
        "unreported 0",
        "health []",
        "health bad",
    ],
)
def test_what_the_fast_path_leaves_to_the_field_checks_is_still_checked(change):
    body = batch(gpus=2, ticks=1)
    change(body["samples"][0])
    fast = outcome(body)
    assert fast[0] == "refused" or fast[3], fast  # refused whole, or the field dropped
