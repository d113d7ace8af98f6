"""The ingest endpoint: every bad input is refused whole with a 4xx naming the field, nothing
of it stored; good batches are stored once, discover GPUs and keep tier capacity current."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Tier
from telemetry.models import Gpu, IngestBatch, Node, ProcessObservation, Sample
from telemetry.services import node_register, node_token_revoke, nodes_health_check
from tests.telemetry.batches import INGEST_URL, batch, gpu_uuid, post, process

pytestmark = pytest.mark.django_db


def _nothing_stored() -> None:
    assert Sample.objects.count() == 0
    assert IngestBatch.objects.count() == 0
    assert Gpu.objects.count() == 0
    assert ProcessObservation.objects.count() == 0


def _refused(response, status: int, field: str, words: str) -> None:
    assert response.status_code == status, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert any(words in message for message in errors[field]), errors[field]


def test_good_batch_is_stored_and_discovers_gpus_into_the_nodes_tier(client, node_token, tier):
    node, token = node_token
    response = post(
        client, token, batch(gpus=3, ticks=2, processes={0: [process(4242, allocation=7)]})
    )

    assert response.status_code == 200, response.content
    assert response.json() == {
        "stored": 6,
        "duplicate": False,
        "directives": [],
        "refused": {},
        # No power cap on the tier: every GPU's limit stays its default.
        "power_caps": {gpu_uuid("n1", i): None for i in range(3)},
    }
    assert Sample.objects.count() == 6
    gpus = Gpu.objects.filter(node=node).order_by("index")
    assert [g.uuid for g in gpus] == [gpu_uuid("n1", i) for i in range(3)]
    assert {g.tier_id for g in gpus} == {tier.pk}
    tier.refresh_from_db()
    assert tier.capacity == 3
    node.refresh_from_db()
    assert node.healthy and node.simulated and node.backend == "simulated"
    observation = ProcessObservation.objects.get()
    assert (observation.pid, observation.allocation_ref, observation.gpu.index) == (4242, 7, 0)
    assert AuditEvent.objects.filter(action="node.gpus_discovered").count() == 1


def test_repeated_batch_is_stored_once(client, node_token):
    _, token = node_token
    body = batch(gpus=2, ticks=3)
    first = post(client, token, body)
    body["sent_at"] = timezone.now().isoformat()  # a retry changes only sent_at
    second = post(client, token, body)

    assert first.json()["stored"] == 6 and first.json()["duplicate"] is False
    assert second.status_code == 200
    assert second.json()["stored"] == 0 and second.json()["duplicate"] is True
    assert Sample.objects.count() == 6
    assert IngestBatch.objects.count() == 1


def test_batch_id_of_another_node_is_refused(client, node_token, tier):
    _, token = node_token
    _, other_token = node_register(name="n2", tier=tier, actor="test")
    body = batch(node="n1")
    post(client, token, body)
    stolen = batch(node="n2")
    stolen["batch_id"] = body["batch_id"]

    _refused(post(client, other_token, stolen), 409, "batch_id", "another node")
    assert Sample.objects.count() == 2


# Each case: (what to break, expected status, field named, words in the message).
def _set(path: str, value):
    def mutate(body):
        target = body
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = keys[-1]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return mutate


_DELETE = object()
_NOW = timezone.now

BAD_FIELDS = [
    (
        "utilization over 100",
        _set("samples.0.utilization_pct", 101),
        "samples[0].utilization_pct",
        "0..100",
    ),
    (
        "utilization negative",
        _set("samples.1.utilization_pct", -1),
        "samples[1].utilization_pct",
        "0..100",
    ),
    (
        "utilization as text",
        _set("samples.0.utilization_pct", "87"),
        "samples[0].utilization_pct",
        "percentage",
    ),
    (
        "utilization as bool",
        _set("samples.0.utilization_pct", True),
        "samples[0].utilization_pct",
        "percentage",
    ),
    (
        "memory used over total",
        _set("samples.0.memory_used_mib", 90000),
        "samples[0].memory_used_mib",
        "memory_total_mib (81920)",
    ),
    (
        "memory as float",
        _set("samples.0.memory_used_mib", 10.5),
        "samples[0].memory_used_mib",
        "whole number of MiB",
    ),
    (
        "memory total zero",
        _set("samples.0.memory_total_mib", 0),
        "samples[0].memory_total_mib",
        "whole number of MiB",
    ),
    ("negative power", _set("samples.0.power_w", -5.0), "samples[0].power_w", "watts"),
    ("milliwatts sent as watts", _set("samples.0.power_w", 312500), "samples[0].power_w", "watts"),
    (
        "temperature absurd",
        _set("samples.0.temperature_c", 900.0),
        "samples[0].temperature_c",
        "Celsius",
    ),
    ("energy negative", _set("samples.0.energy_j", -1.0), "samples[0].energy_j", "joules"),
    ("infinite energy (1e999)", None, "samples[0].energy_j", "finite"),
    ("unknown GPU", _set("samples.0.gpu", "GPU-nobody"), "samples[0].gpu", "unknown GPU"),
    (
        "time without timezone",
        _set("samples.0.at", "2026-01-01T00:00:00"),
        "samples[0].at",
        "timezone",
    ),
    ("time not a time", _set("samples.0.at", "yesterday"), "samples[0].at", "ISO 8601"),
    (
        "sample from the future",
        lambda b: _set("samples.0.at", (_NOW() + timedelta(hours=1)).isoformat())(b),
        "samples[0].at",
        "ahead of the server's clock",
    ),
    (
        "stale sample",
        lambda b: _set("samples.0.at", (_NOW() - timedelta(days=3)).isoformat())(b),
        "samples[0].at",
        "older than",
    ),
    (
        "sent_at skewed",
        lambda b: _set("sent_at", (_NOW() - timedelta(minutes=30)).isoformat())(b),
        "sent_at",
        "differs from the server's clock",
    ),
    ("batch_id missing", _set("batch_id", _DELETE), "batch_id", "required"),
    ("batch_id not a uuid", _set("batch_id", "batch-1"), "batch_id", "UUID"),
    ("backend unknown", _set("backend", "rocm"), "backend", "'nvml' or 'simulated'"),
    ("hostname missing", _set("hostname", _DELETE), "hostname", "non-empty string"),
    ("gpus not a list", _set("gpus", {"uuid": "x"}), "gpus", "list"),
    ("gpu index negative", _set("gpus.0.index", -1), "gpus[0].index", "0..1023"),
    (
        "process pid zero",
        _set("samples.0.processes", [process(0)]),
        "samples[0].processes[0].pid",
        "process id",
    ),
    (
        "process state unknown",
        _set("samples.0.processes", [process(5, state="zombie")]),
        "samples[0].processes[0].state",
        "'running' or 'stopped'",
    ),
    (
        "directive outcome unknown",
        _set("directive_results", [{"id": 1, "outcome": "ok", "detail": ""}]),
        "directive_results[0].outcome",
        "'done', 'gone' or 'failed'",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "words"), [c[1:] for c in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS]
)
def test_bad_field_is_refused_naming_it_and_nothing_is_stored(
    client, node_token, mutate, field, words
):
    _, token = node_token
    body = batch(gpus=2, ticks=2)
    if mutate is None:
        raw = json.dumps(body).replace('"energy_j": 1000.0', '"energy_j": 1e999', 1)
        response = post(client, token, raw)
    else:
        mutate(body)
        response = post(client, token, body)
    _refused(response, 400, field, words)
    _nothing_stored()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(client, node_token, constant):
    _, token = node_token
    raw = json.dumps(batch()).replace('"power_w": 150.5', f'"power_w": {constant}', 1)
    _refused(post(client, token, raw), 400, "body", "finite numbers only")
    _nothing_stored()


def test_truncated_json_is_refused(client, node_token):
    _, token = node_token
    raw = json.dumps(batch(ticks=3))
    _refused(post(client, token, raw[: len(raw) // 2]), 400, "body", "not valid JSON")
    _nothing_stored()


def test_body_that_is_not_an_object_is_refused(client, node_token):
    _, token = node_token
    _refused(post(client, token, "[1, 2]"), 400, "body", "JSON object")


def test_one_bad_sample_refuses_the_whole_batch(client, node_token):
    _, token = node_token
    body = batch(gpus=4, ticks=5)
    body["samples"][-1]["utilization_pct"] = 250
    _refused(post(client, token, body), 400, "samples[19].utilization_pct", "0..100")
    _nothing_stored()


def test_too_many_samples_is_refused_with_413(client, node_token, settings):
    _, token = node_token
    settings.GPUMARKET_INGEST_MAX_SAMPLES = 10
    _refused(post(client, token, batch(gpus=2, ticks=6)), 413, "samples", "at most 10")
    _nothing_stored()


def test_oversized_body_is_refused_with_413(client, node_token, settings):
    _, token = node_token
    settings.GPUMARKET_INGEST_MAX_BYTES = 2000
    _refused(post(client, token, batch(gpus=4, ticks=4)), 413, "body", "larger than 2000 bytes")
    _nothing_stored()


def test_another_nodes_gpu_is_refused(client, node_token, tier):
    _, token = node_token
    _, other_token = node_register(name="n2", tier=tier, actor="test")
    assert post(client, token, batch(node="n1")).status_code == 200
    # n2 claims n1's GPU 0 as its own.
    body = batch(node="n2")
    body["gpus"][0]["uuid"] = body["samples"][0]["gpu"] = gpu_uuid("n1", 0)

    _refused(post(client, other_token, body), 403, "gpus[0].uuid", "registered to another node")
    assert Sample.objects.count() == 2  # n1's first batch only
    assert not Gpu.objects.filter(node__name="n2").exists()


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer gmn_000000000000_notarealsecret",
        "Bearer garbage",
    ],
)
def test_bad_token_is_401(client, node_token, header):
    response = client.post(
        INGEST_URL,
        data=json.dumps(batch()),
        content_type="application/json",
        headers={"Authorization": header} if header else {},
    )
    _refused(response, 401, "authorization", "token")
    assert response["WWW-Authenticate"].startswith("Bearer")
    _nothing_stored()


def test_right_prefix_wrong_secret_is_401(client, node_token):
    _, token = node_token
    _refused(post(client, token[:-4] + "AAAA", batch()), 401, "authorization", "not valid")
    _nothing_stored()


def test_revoked_token_is_401(client, node_token):
    node, token = node_token
    node_token_revoke(node=node, actor="test")
    _refused(post(client, token, batch()), 401, "authorization", "revoked")
    _nothing_stored()


def test_wrong_content_type_and_method(client, node_token):
    _, token = node_token
    response = client.post(
        INGEST_URL,
        data="x=1",
        content_type="application/x-www-form-urlencoded",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 415
    assert client.get(INGEST_URL).status_code == 405


def test_slashed_path_is_accepted_too(client, node_token):
    _, token = node_token
    response = client.post(
        INGEST_URL + "/",
        data=json.dumps(batch()),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200


def test_stale_node_turns_unhealthy_and_its_gpus_leave_capacity(client, node_token, tier, settings):
    node, token = node_token
    _, other_token = node_register(name="n2", tier=tier, actor="test")
    post(client, token, batch(node="n1", gpus=4))
    post(client, other_token, batch(node="n2", gpus=2))
    tier.refresh_from_db()
    assert tier.capacity == 6

    later = timezone.now() + timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS + 1)
    Node.objects.filter(name="n2").update(last_seen_at=later)  # n2 kept reporting
    marked = nodes_health_check(now=later)

    assert [n.name for n in marked] == ["n1"]
    node.refresh_from_db()
    tier.refresh_from_db()
    assert not node.healthy
    assert tier.capacity == 2
    assert not Gpu.objects.filter(node=node, healthy=True).exists()
    assert AuditEvent.objects.filter(action="node.unhealthy").count() == 1

    # It reports again: healthy, and its GPUs count again.
    assert post(client, token, batch(node="n1", gpus=4)).status_code == 200
    node.refresh_from_db()
    tier.refresh_from_db()
    assert node.healthy and tier.capacity == 6


def test_gpu_missing_from_a_report_leaves_capacity(client, node_token, tier):
    _, token = node_token
    post(client, token, batch(gpus=4))
    post(client, token, batch(gpus=3))
    tier.refresh_from_db()
    assert tier.capacity == 3
    assert not Gpu.objects.get(uuid=gpu_uuid("n1", 3)).healthy


def test_late_backlog_batch_does_not_replace_newer_process_view(client, node_token):
    _, token = node_token
    now = timezone.now()
    post(client, token, batch(gpus=1, at=now, processes={0: [process(11, allocation=1)]}))
    old = batch(gpus=1, at=now - timedelta(seconds=30), processes={0: [process(99)]})
    assert post(client, token, old).status_code == 200
    assert list(ProcessObservation.objects.values_list("pid", flat=True)) == [11]
    assert Sample.objects.count() == 2


def test_tier_capacity_counts_only_the_nodes_tier(client, node_token, tier):
    other = Tier.objects.create(slug="h100", name="H100")
    _, token = node_register(name="h-node", tier=other, actor="test")
    post(client, token, batch(node="h-node", gpus=8))
    tier.refresh_from_db()
    other.refresh_from_db()
    assert (tier.capacity, other.capacity) == (0, 8)


def test_a_node_posting_faster_than_its_rate_gets_429_with_retry_after_and_nothing_stored(
    client, node_token, settings
):
    from django.core.cache import cache

    cache.clear()
    settings.GPUMARKET_INGEST_RATE_PER_MINUTE = 2
    node, token = node_token
    answers = [post(client, token, batch(gpus=1)) for _ in range(3)]
    # The third may land in a new minute; then a fourth is still over the rate.
    if answers[-1].status_code == 200:
        answers += [post(client, token, batch(gpus=1)) for _ in range(2)]
    limited = [a for a in answers if a.status_code == 429]
    assert limited, [a.status_code for a in answers]
    assert 1 <= int(limited[0]["Retry-After"]) <= 60
    assert "batches a minute" in limited[0].json()["errors"]["rate"][0]
    assert IngestBatch.objects.filter(node=node).count() == len(answers) - len(limited)


def test_ingest_goes_on_while_the_rate_limit_cache_is_down_and_metrics_count_it(
    client, node_token, settings, caplog
):
    from tests.conftest import free_port
    from tests.telemetry.test_metrics import _value

    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        }
    }
    metrics = {"HTTP_AUTHORIZATION": f"Bearer {settings.GPUMARKET_METRICS_TOKEN}"}
    body = client.get("/metrics", **metrics).content.decode()
    before = _value(body, "gpumarket_rate_limit_fail_open_total", scope="ingest")
    node, token = node_token
    assert post(client, token, batch(gpus=1)).status_code == 200
    assert IngestBatch.objects.filter(node=node).count() == 1
    assert "rate limit ingest not counted" in caplog.text
    body = client.get("/metrics", **metrics).content.decode()
    assert _value(body, "gpumarket_rate_limit_fail_open_total", scope="ingest") == before + 1
