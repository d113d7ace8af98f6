import pytest
from kubernetes import client

from telemetry.agent.kubernetes_executor import KubernetesExecutor
from telemetry.agent.protocol import Directive, ObservedProcess, ProcessSample


def executor_for(api) -> KubernetesExecutor:
    return KubernetesExecutor(api_client=api.client())


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
    ("action", "suspend"),
    [("pause", True), ("terminate", True), ("suspend", True), ("resume", False)],
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
