import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from telemetry.agent.kubernetes_executor import KubernetesExecutor
from telemetry.agent.protocol import Directive, ObservedProcess, ProcessSample


@dataclass
class StandInApi:
    """The two Kubernetes API calls the executor makes, on 127.0.0.1."""

    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    patches: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def pod_of_job(self, namespace: str, pod: str, job: str) -> None:
        self.pods[(namespace, pod)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": namespace,
                "labels": {"batch.kubernetes.io/job-name": job},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job,
                        "uid": "u-1",
                        "controller": True,
                    }
                ],
            },
        }
        self.jobs.add((namespace, job))


def _not_found(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": f'{kind} "{name}" not found',
        "reason": "NotFound",
        "code": 404,
    }


@pytest.fixture
def api() -> Iterator[StandInApi]:
    state = StandInApi()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802
            parts = self.path.split("?")[0].strip("/").split("/")
            # api/v1/namespaces/<ns>/pods/<name>
            if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                pod = state.pods.get((parts[3], parts[5]))
                if pod is not None:
                    return self._answer(200, pod)
            return self._answer(404, _not_found("pods", parts[-1]))

        def do_PATCH(self) -> None:  # noqa: N802
            parts = self.path.split("?")[0].strip("/").split("/")
            # apis/batch/v1/namespaces/<ns>/jobs/<name>
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            namespace, name = parts[4], parts[6]
            state.patches.append(
                {
                    "path": self.path,
                    "content_type": self.headers["Content-Type"],
                    "body": body,
                }
            )
            if (namespace, name) not in state.jobs:
                return self._answer(404, _not_found("jobs.batch", name))
            return self._answer(
                200,
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "suspend": body["spec"]["suspend"],
                        "template": {"spec": {"containers": []}},
                    },
                },
            )

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def executor_for(api: StandInApi) -> KubernetesExecutor:
    return KubernetesExecutor(api_client=client.ApiClient(client.Configuration(host=api.url)))


def directive(action, *, pod=None, namespace="research", pid=None, directive_id=1):
    return Directive(
        id=directive_id,
        action=action,
        gpu="GPU-0",
        pid=pid,
        allocation=None,
        slurm_job=None,
        pod=pod,
        namespace=namespace,
        grace_seconds=30,
        reason="test",
    )


@pytest.mark.parametrize(
    ("action", "suspend"), [("pause", True), ("terminate", True), ("resume", False)]
)
def test_action_patches_the_owning_jobs_suspend_flag(api, action, suspend):
    api.pod_of_job("research", "train-7-x2x9q", "train-7")

    result = executor_for(api).apply(directive(action, pod="train-7-x2x9q"), observed={})

    assert result.outcome == "done"
    assert result.detail == f"Job research/train-7 spec.suspend={str(suspend).lower()}"
    [patch] = api.patches
    assert patch["path"] == "/apis/batch/v1/namespaces/research/jobs/train-7"
    assert patch["content_type"] == "application/merge-patch+json"
    assert patch["body"] == {"spec": {"suspend": suspend}}


def test_resume_after_the_pod_was_deleted_uses_the_remembered_job(api):
    # Suspending a Job deletes its pods, so resume names a pod that no longer exists.
    api.pod_of_job("research", "train-7-x2x9q", "long-name-that-ends-abcde")
    executor = executor_for(api)
    executor.apply(directive("pause", pod="train-7-x2x9q"), observed={})
    del api.pods[("research", "train-7-x2x9q")]

    result = executor.apply(directive("resume", pod="train-7-x2x9q", directive_id=2), observed={})

    assert result.outcome == "done"
    assert api.patches[-1]["path"].endswith("/jobs/long-name-that-ends-abcde")


def test_unresolved_pod_is_tried_as_a_job_name_then_without_its_suffix(api):
    api.jobs.add(("research", "sweep"))

    result = executor_for(api).apply(directive("resume", pod="sweep-k8q2z"), observed={})

    assert result.outcome == "done"
    assert [p["path"].rsplit("/", 1)[1] for p in api.patches] == ["sweep-k8q2z", "sweep"]


def test_no_such_pod_or_job_is_gone(api):
    result = executor_for(api).apply(directive("pause", pod="vanished-abcde"), observed={})

    assert result.outcome == "gone"


def test_pod_not_run_by_a_job_fails(api):
    api.pods[("research", "bare")] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare"},
    }

    result = executor_for(api).apply(directive("pause", pod="bare"), observed={})

    assert result.outcome == "failed"
    assert "not run by a Job" in result.detail
    assert api.patches == []


def test_pod_comes_from_the_observed_process_and_namespace_defaults(api):
    api.pod_of_job("default", "infer-0-aaaaa", "infer-0")
    seen = {
        9: ObservedProcess(
            gpu="GPU-0",
            process=ProcessSample(
                pid=9,
                memory_mib=1,
                allocation=1,
                slurm_job=None,
                pod="infer-0-aaaaa",
                state="running",
            ),
        )
    }

    result = executor_for(api).apply(directive("pause", pid=9, namespace=None), observed=seen)

    assert result.outcome == "done"
    assert api.patches[0]["path"] == "/apis/batch/v1/namespaces/default/jobs/infer-0"


def test_unreachable_api_fails_instead_of_raising():
    unreachable = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    executor = KubernetesExecutor(api_client=unreachable, request_timeout_seconds=1)

    result = executor.apply(directive("pause", pod="x-abcde"), observed={})

    assert result.outcome == "failed"
    assert "unreachable" in result.detail
