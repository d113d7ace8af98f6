"""Carry out directives on Kubernetes by suspending and resuming the Job that owns a pod.

A suspended Job has its running pods deleted by the Job controller and recreated when it is
resumed, so on Kubernetes "pause" means stop and restart from the job's last checkpoint;
"suspend" is the same (the pods get the kubelet's SIGTERM and their
terminationGracePeriodSeconds to checkpoint, not the directive's signal and grace), and
"terminate" also suspends (the agent never deletes a tenant's objects), which leaves the Job
ready to resume when a new allocation allows.

Which Job: the directive's `pod` (or, when it names none, the pod of the process it is
about). The Job is read from the pod's owner reference (or its `batch.kubernetes.io/job-name`
label) while the pod exists and remembered, because resuming happens after suspension
deleted the pod. For a pod the agent never resolved, `pod` is tried as a Job name, then
with the Job controller's random suffix (`<job>-<5 characters>`) removed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from telemetry.agent.directives import targets_for
from telemetry.agent.errors import ExecutorUnavailable
from telemetry.agent.protocol import Directive, DirectiveResult, ObservedProcess

logger = logging.getLogger(__name__)

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
_POD_SUFFIX = re.compile(r"^(?P<job>.+)-[a-z0-9]{5}$")


def api_client_from_environment() -> client.ApiClient:
    """In-cluster credentials when the agent runs as a pod, else the usual kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ExecutorUnavailable(
                f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}"
            ) from exc
    return client.ApiClient()


class _NotAJob(Exception):
    pass


class KubernetesExecutor:
    name = "kubernetes"

    def __init__(
        self,
        *,
        api_client: client.ApiClient | None = None,
        request_timeout_seconds: float = 10.0,
        default_namespace: str = "default",
    ) -> None:
        api = api_client if api_client is not None else api_client_from_environment()
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._timeout = request_timeout_seconds
        self._default_namespace = default_namespace
        self._job_of_pod: dict[tuple[str, str], str] = {}

    def apply(
        self, directive: Directive, *, observed: Mapping[int, ObservedProcess]
    ) -> DirectiveResult | None:
        pod = directive.pod or next(
            (e.process.pod for e in targets_for(directive, observed) if e.process.pod), None
        )
        if pod is None:
            return DirectiveResult(
                id=directive.id, outcome="failed", detail="directive names no pod or Job"
            )
        namespace = directive.namespace or self._default_namespace
        suspend = directive.action != "resume"
        try:
            candidates = self._job_candidates(namespace, pod)
            for job in candidates:
                if self._patch(namespace, job, suspend=suspend):
                    logger.info(
                        "directive %d: Job %s/%s suspend=%s", directive.id, namespace, job, suspend
                    )
                    return DirectiveResult(
                        id=directive.id,
                        outcome="done",
                        detail=f"Job {namespace}/{job} spec.suspend={str(suspend).lower()}",
                    )
        except _NotAJob as exc:
            return DirectiveResult(id=directive.id, outcome="failed", detail=str(exc))
        except ApiException as exc:
            return DirectiveResult(
                id=directive.id,
                outcome="failed",
                detail=f"Kubernetes API refused: {exc.status} {exc.reason}",
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return DirectiveResult(
                id=directive.id, outcome="failed", detail=f"Kubernetes API unreachable: {exc}"
            )
        return DirectiveResult(
            id=directive.id,
            outcome="gone",
            detail=f"no Job for pod {namespace}/{pod} (tried {', '.join(candidates)})",
        )

    def poll(self) -> list[DirectiveResult]:
        return []

    def _job_candidates(self, namespace: str, pod: str) -> list[str]:
        try:
            found = self._core.read_namespaced_pod(
                name=pod, namespace=namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            remembered = self._job_of_pod.get((namespace, pod))
            if remembered is not None:
                return [remembered]
            candidates = [pod]
            match = _POD_SUFFIX.match(pod)
            if match:
                candidates.append(match.group("job"))
            return candidates
        job = _owning_job(found)
        if job is None:
            raise _NotAJob(f"pod {namespace}/{pod} is not run by a Job; only Jobs can be suspended")
        self._job_of_pod[(namespace, pod)] = job
        return [job]

    def _patch(self, namespace: str, job: str, *, suspend: bool) -> bool:
        """Set the Job's spec.suspend; False if there is no such Job."""
        try:
            self._batch.patch_namespaced_job(
                name=job,
                namespace=namespace,
                body={"spec": {"suspend": suspend}},
                # A JSON merge patch: the client's default for PATCH is a JSON Patch list.
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _owning_job(pod: Any) -> str | None:
    metadata = pod.metadata
    for owner in metadata.owner_references or []:
        if owner.kind == "Job":
            return str(owner.name)
    labels = metadata.labels or {}
    for label in JOB_NAME_LABELS:
        if labels.get(label):
            return str(labels[label])
    return None
