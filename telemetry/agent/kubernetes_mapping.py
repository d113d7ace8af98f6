"""A pod's allocation, from its label `gpumarket.io/allocation` (read from the API server).

The pod is found by name, so the workload must expose its name to its processes through the
downward API (`POD_NAME` from `metadata.name`, and `POD_NAMESPACE` from
`metadata.namespace` unless it runs in the agent's default namespace). A pod the agent
knows only by the UID in its cgroup is not looked up: the API reads pods by name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from telemetry.agent.kubernetes_executor import api_client_from_environment
from telemetry.agent.lookup import (
    FAILED_TTL_SECONDS,
    FOUND_TTL_SECONDS,
    Lookup,
    LookupCache,
    allocation_value_parse,
)
from telemetry.agent.procmap import ProcessInfo

logger = logging.getLogger(__name__)

ALLOCATION_LABEL = "gpumarket.io/allocation"


class KubernetesAllocations:
    name = "kubernetes"

    def __init__(
        self,
        *,
        api_client: client.ApiClient | None = None,
        default_namespace: str = "default",
        request_timeout_seconds: float = 5.0,
        found_ttl_seconds: float = FOUND_TTL_SECONDS,
        failed_ttl_seconds: float = FAILED_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        api = api_client if api_client is not None else api_client_from_environment()
        self._core = client.CoreV1Api(api)
        self._default_namespace = default_namespace
        self._timeout = request_timeout_seconds
        self._cache = LookupCache(
            found_ttl_seconds=found_ttl_seconds, failed_ttl_seconds=failed_ttl_seconds, clock=clock
        )

    def allocation_for(self, info: ProcessInfo) -> int | None:
        if info.pod is None:
            return None
        if not info.pod_named:
            # Cached like an answer, so the hint is logged once per pod per few minutes.
            return self._cache.get(("uid", info.pod), lambda: self._unnamed(info))
        namespace = info.namespace or self._default_namespace
        pod = info.pod
        return self._cache.get(("pod", namespace, pod), lambda: self._lookup(namespace, pod))

    def _unnamed(self, info: ProcessInfo) -> Lookup:
        logger.info(
            "pod %s (pid %d) is known only by its UID; set POD_NAME through the downward API "
            "so its %s label can be read",
            info.pod,
            info.pid,
            ALLOCATION_LABEL,
        )
        return Lookup(allocation=None, settled=True)

    def _lookup(self, namespace: str, pod: str) -> Lookup:
        try:
            found = self._core.read_namespaced_pod(
                name=pod, namespace=namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                logger.info("pod %s/%s not found; its work stays untagged", namespace, pod)
            else:
                logger.warning(
                    "reading pod %s/%s: Kubernetes API refused: %s %s",
                    namespace,
                    pod,
                    exc.status,
                    exc.reason,
                )
            return Lookup(allocation=None, settled=False)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            logger.warning("reading pod %s/%s: Kubernetes API unreachable: %s", namespace, pod, exc)
            return Lookup(allocation=None, settled=False)
        value = (found.metadata.labels or {}).get(ALLOCATION_LABEL)
        if value is None:
            return Lookup(allocation=None, settled=True)
        allocation = allocation_value_parse(value, where=f"pod {namespace}/{pod}")
        return Lookup(allocation=allocation, settled=True)
