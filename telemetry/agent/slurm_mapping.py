"""A Slurm job's allocation, from the job's comment: `sbatch --comment=gpumarket:allocation=42`.

Read with `scontrol show job <id> --oneliner`, which any Slurm user may run (no operator
rights needed, unlike the slurm executor). The comment is one comma-separated list without
spaces; the item `gpumarket:allocation=<int>` names the allocation, other items are the
site's own business.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable

from telemetry.agent.errors import MappingUnavailable
from telemetry.agent.lookup import (
    FAILED_TTL_SECONDS,
    FOUND_TTL_SECONDS,
    Lookup,
    LookupCache,
    allocation_value_parse,
)
from telemetry.agent.procmap import ProcessInfo
from telemetry.agent.slurm_executor import JOB_GONE, JOB_ID

logger = logging.getLogger(__name__)

COMMENT_TAG = "gpumarket:allocation="
# `Comment=` starts a field of the one-line job record; "(null)" when the job has none.
_COMMENT = re.compile(r"(?:^|\s)Comment=(\S*)")


def comment_allocation(record: str, *, job: str) -> int | None:
    """The allocation named in the `Comment=` field of scontrol's job record, if any."""
    match = _COMMENT.search(record)
    if match is None:
        return None
    for item in match.group(1).split(","):
        if item.startswith(COMMENT_TAG):
            return allocation_value_parse(item[len(COMMENT_TAG) :], where=f"Slurm job {job}")
    return None


class SlurmAllocations:
    name = "slurm"

    def __init__(
        self,
        *,
        scontrol: str = "scontrol",
        timeout_seconds: float = 5.0,
        found_ttl_seconds: float = FOUND_TTL_SECONDS,
        failed_ttl_seconds: float = FAILED_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        found = shutil.which(scontrol)
        if found is None:
            raise MappingUnavailable(
                f"{scontrol!r} is not on PATH; mapping Slurm jobs needs Slurm's client tools"
            )
        self._scontrol = found
        self._timeout = timeout_seconds
        self._cache = LookupCache(
            found_ttl_seconds=found_ttl_seconds, failed_ttl_seconds=failed_ttl_seconds, clock=clock
        )

    def allocation_for(self, info: ProcessInfo) -> int | None:
        job = info.slurm_job
        if job is None:
            return None
        return self._cache.get(job, lambda: self._lookup(job))

    def _lookup(self, job: str) -> Lookup:
        if not JOB_ID.match(job):
            logger.warning("not a Slurm job id: %r; its work stays untagged", job)
            return Lookup(allocation=None, settled=True)
        shown = f"scontrol show job {job} --oneliner"
        try:
            completed = subprocess.run(
                [self._scontrol, "show", "job", job, "--oneliner"],
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            logger.warning("%s: no answer in %ss", shown, self._timeout)
            return Lookup(allocation=None, settled=False)
        except OSError as exc:
            logger.warning("%s: %s", shown, exc)
            return Lookup(allocation=None, settled=False)
        if completed.returncode != 0:
            message = (completed.stderr or completed.stdout).strip()
            if JOB_GONE.search(message):
                # Just submitted and not yet known, or finished: ask again soon.
                logger.info("%s: the controller does not know the job (%s)", shown, message)
            else:
                logger.warning("%s exited %d: %s", shown, completed.returncode, message)
            return Lookup(allocation=None, settled=False)
        allocation = comment_allocation(completed.stdout, job=job)
        if allocation is not None:
            logger.debug("Slurm job %s belongs to allocation %d", job, allocation)
        return Lookup(allocation=allocation, settled=True)
