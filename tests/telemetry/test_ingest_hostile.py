"""Hostile input at the ingest endpoint (and the bids API).

Whatever a process on a node puts in its own environment (a 100-character SLURM_JOB_ID, a
300-character POD_NAME, a claim that is not an allocation id, 300 processes on one GPU) is
refused field by field: the batch is stored, the bad field is dropped and named in the
response, and the node keeps reporting. Input no agent sends (a list where a string belongs,
a NUL character, JSON nested 100,000 deep) is a 400 naming the field, never a 500. Refused
batches and refused fields are counted per node and show on the fleet page and in /metrics.
"""

from __future__ import annotations

import pytest

from telemetry.models import IngestBatch, Node, ProcessObservation, Sample
from telemetry.payload.reports import MAX_PROCESSES_PER_SAMPLE
from tests.telemetry.batches import batch, post, process

pytestmark = pytest.mark.django_db

DEEP = b"[" * 100_000 + b"]" * 100_000


def _with_process(**fields) -> dict:
    return batch(gpus=1, processes={0: [process(4242) | fields]})


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        pytest.param({"slurm_job": "9" * 100}, "slurm_job", "at most 64", id="long-slurm-job"),
        pytest.param({"pod": "p" * 300}, "pod", "at most 253", id="long-pod-name"),
        pytest.param({"allocation": "65"}, "allocation", "allocation id", id="claim-as-text"),
        pytest.param({"allocation": -3}, "allocation", "allocation id", id="claim-negative"),
        pytest.param({"slurm_job": "12\x0034"}, "slurm_job", "NUL", id="nul-in-slurm-job"),
    ],
)
def test_a_bad_process_claim_is_dropped_and_named_and_the_batch_is_stored(
    client, node_token, fields, field, words
):
    _, token = node_token
    response = post(client, token, _with_process(**fields))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["stored"] == 1
    name = f"samples[0].processes[0].{field}"
    assert any(words in m for m in body["refused"][name]), body["refused"]
    observation = ProcessObservation.objects.get(pid=4242)
    assert observation.allocation_ref is None
    assert (observation.slurm_job, observation.pod) == ("", "")
    node = Node.objects.get()
    assert (node.refused_batches, node.refused_fields) == (0, 1)
    assert node.healthy


def test_more_processes_on_a_gpu_than_the_limit_keeps_the_first_and_counts_the_rest(
    client, node_token
):
    _, token = node_token
    many = [process(1000 + i) for i in range(MAX_PROCESSES_PER_SAMPLE + 44)]
    response = post(client, token, batch(gpus=1, processes={0: many}))
    assert response.status_code == 200, response.content
    refused = response.json()["refused"]["samples[0].processes"]
    assert any(f"first {MAX_PROCESSES_PER_SAMPLE}" in m for m in refused)
    listed = ProcessObservation.objects.exclude(pid=0)
    assert listed.count() == MAX_PROCESSES_PER_SAMPLE
    # The other 44 are one observation of pid 0 (unreported work), which enforcement sweeps.
    assert ProcessObservation.objects.get(pid=0).memory_mib == 44 * 2048


@pytest.mark.parametrize("shape", [[], {}, ["nvml"]], ids=["list", "object", "list-of-str"])
@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("backend",), "backend"),
        (("samples", 0, "gpu"), "samples[0].gpu"),
        (("samples", 0, "processes", 0, "state"), "samples[0].processes[0].state"),
        (("directive_results", 0, "outcome"), "directive_results[0].outcome"),
    ],
)
def test_a_list_or_object_where_a_string_belongs_is_a_400_naming_the_field(
    client, node_token, path, field, shape
):
    _, token = node_token
    body = batch(gpus=1, processes={0: [process(7)]}, results=[{"id": 1, "outcome": "done"}])
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = shape
    response = post(client, token, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert Sample.objects.count() == IngestBatch.objects.count() == 0


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("hostname",), "hostname"),
        (("agent_version",), "agent_version"),
        (("gpus", 0, "name"), "gpus[0].name"),
        (("gpus", 0, "uuid"), "gpus[0].uuid"),
        (("directive_results", 0, "detail"), "directive_results[0].detail"),
    ],
)
def test_a_nul_character_is_a_400_naming_the_field(client, node_token, path, field):
    _, token = node_token
    body = batch(gpus=1, results=[{"id": 1, "outcome": "done", "detail": "ok"}])
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "bad\x00value"
    response = post(client, token, body)
    assert response.status_code == 400, response.content
    assert any("NUL" in m for m in response.json()["errors"][field])
    assert Sample.objects.count() == 0


def test_json_nested_100k_deep_is_a_400(client, node_token):
    _, token = node_token
    response = post(client, token, DEEP)
    assert response.status_code == 400
    assert "nested" in response.json()["errors"]["body"][0]


def test_json_nested_100k_deep_on_the_bids_api_is_a_400(client):
    from tests import factories

    tenant = factories.tenant(credits=1000)
    user = factories.member(tenant=tenant)
    client.force_login(user)
    response = client.post("/api/v1/bids", data=DEEP, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert "nested" in response.content.decode()


def test_a_refused_batch_is_counted_and_shows_on_the_fleet_page_and_in_metrics(
    client, node_token, settings
):
    from tests import factories

    _, token = node_token
    body = batch(gpus=1)
    body["samples"][0]["utilization_pct"] = 250  # an agent bug: the whole batch is refused
    assert post(client, token, body).status_code == 400
    assert post(client, token, b"{").status_code == 400
    node = Node.objects.get()
    assert node.refused_batches == 2
    assert "utilization_pct" in node.last_refusal or "JSON" in node.last_refusal
    bearer = {"Authorization": f"Bearer {settings.GPUMARKET_METRICS_TOKEN}"}
    metrics = client.get("/metrics", headers=bearer).content.decode()
    assert 'gpumarket_ingest_refused_batches_total{node="n1"} 2' in metrics
    client.force_login(factories.admin_user())
    page = client.get("/fleet/").content.decode()
    assert "refused 2 batches" in page
