"""Slurm reservations for placed allocations: `sbatch --reservation=gm-<id>` lands on the
allocation's node, and only under its team's Slurm account. ``gm-`` is the site prefix
(GPUMARKET_SLURM_RESERVATION_PREFIX): platforms sharing a cluster each set their own, and
every name this platform makes, and every reservation it ends, carries it.

Settlement queues ``slurm_reservations_create`` for the allocations it placed when
GPUMARKET_SLURM_RESERVATIONS is on (the platform's workers then need Slurm's client tools and
an operator account). Each team gets the Slurm account ``gm-<team slug>`` (created when
missing; a site adds its users to it with ``sacctmgr add user <name> account=gm-<slug>``).
The reservation starts with the window (or now, if the window has begun) and ends with it,
so Slurm removes it at the window's end by itself.

Slurm 22.05 (Debian 12's) refuses GPUs in a reservation ("TRES type 'gres/gpu' not supported
with reservations"), so the reservation holds the node for the account; which GPUs the work
uses is bound by `gpumarket run` (CUDA_VISIBLE_DEVICES and the launch token) inside the job.
Times are written in the platform's local time zone, which must be the controller's.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from market.models import Allocation
from market.services._common import now_or
from market.services.launch import placement_by_node

logger = logging.getLogger(__name__)

# Slurm names: letters, digits, '-', '_' and '.'; account names are at most 64 characters here.
_UNSAFE = re.compile(r"[^a-z0-9_.-]")


class SlurmError(Exception):
    """A Slurm command failed; the message carries its output."""


@dataclass(frozen=True)
class Reserved:
    allocation: int
    name: str
    created: bool  # False when it already existed (a retried task)


# A prefix that starts a Slurm name (never one that reads as an option), leaving room for ids.
_PREFIX = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,43}$")


def reservation_name(allocation: Allocation | int) -> str:
    pk = allocation if isinstance(allocation, int) else allocation.pk
    prefix = settings.GPUMARKET_SLURM_RESERVATION_PREFIX
    if not _PREFIX.match(prefix):
        raise ImproperlyConfigured(
            f"GPUMARKET_SLURM_RESERVATION_PREFIX={prefix!r}: must be 1 to 44 letters, digits, "
            "'_', '.' or '-', not starting with '-' or '.'"
        )
    return f"{prefix}{pk}"


def slurm_account(tenant_slug: str) -> str:
    return ("gm-" + _UNSAFE.sub("-", tenant_slug.lower()))[:64]


def _slurm_time(at: datetime) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%dT%H:%M:%S")


def _run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=settings.GPUMARKET_SLURM_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{' '.join(command)}: {exc}") from exc
    return done


def _account_ensure(account: str) -> None:
    sacctmgr = settings.GPUMARKET_SLURM_SACCTMGR
    shown = _run([sacctmgr, "-n", "-P", "list", "account", account, "format=account"])
    if account in shown.stdout.split():
        return
    added = _run([sacctmgr, "-i", "add", "account", account, f"Description={account}"])
    if added.returncode != 0:
        raise SlurmError(
            f"sacctmgr add account {account}: {(added.stderr or added.stdout).strip()}"
        )


def _exists(name: str) -> bool:
    shown = _run([settings.GPUMARKET_SLURM_SCONTROL, "show", "reservation", name])
    return shown.returncode == 0 and f"ReservationName={name}" in shown.stdout


def slurm_reservations_create(
    *, allocation_ids: Iterable[int], now: datetime | None = None
) -> list[Reserved]:
    """Create the reservation of each placed, live allocation whose window has not ended.
    Idempotent (an existing reservation is left as it is). Raises SlurmError on the first
    Slurm refusal, after creating the ones before it; a retry creates the rest."""
    now = now_or(now)
    done: list[Reserved] = []
    allocations = (
        Allocation.objects.filter(
            pk__in=list(allocation_ids),
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            ends_at__gt=now,
        )
        .exclude(placement=[])
        .select_related("tenant")
        .order_by("pk")
    )
    for allocation in allocations:
        name = reservation_name(allocation)
        if _exists(name):
            done.append(Reserved(allocation.pk, name, created=False))
            continue
        account = slurm_account(allocation.tenant.slug)
        _account_ensure(account)
        starts = "now" if allocation.starts_at <= now else _slurm_time(allocation.starts_at)
        command = [
            settings.GPUMARKET_SLURM_SCONTROL,
            "create",
            "reservation",
            f"ReservationName={name}",
            f"StartTime={starts}",
            f"EndTime={_slurm_time(allocation.ends_at)}",
            f"Nodes={','.join(placement_by_node(allocation))}",
            f"Accounts={account}",
            # Several allocations share a node, and work may already run on it.
            "Flags=OVERLAP,IGNORE_JOBS",
        ]
        created = _run(command)
        if created.returncode != 0:
            raise SlurmError(
                f"scontrol create reservation {name}: {(created.stderr or created.stdout).strip()}"
            )
        logger.info("allocation %s: Slurm reservation %s for %s", allocation.pk, name, account)
        done.append(Reserved(allocation.pk, name, created=True))
    return done


def slurm_reservations_end(
    *, allocation_ids: Iterable[int], now: datetime | None = None
) -> list[str]:
    """End the reservations of allocations that ended before their window did (a voided
    round revokes them), so no new job gets in. Slurm refuses to delete a reservation a job
    still runs in ("Requested reservation is in use"; enforcement is stopping that job), so
    such a one is cut short instead: its end moved to now, Slurm drops it once it is free.
    A reservation Slurm no longer has is fine. Returns those ended."""
    now = now_or(now)
    scontrol = settings.GPUMARKET_SLURM_SCONTROL
    ended = []
    for pk in sorted(set(allocation_ids)):
        name = reservation_name(pk)
        if not _exists(name):
            continue
        done = _run([scontrol, "delete", f"ReservationName={name}"])
        if done.returncode != 0 and _exists(name):
            done = _run(
                [
                    scontrol,
                    "update",
                    f"ReservationName={name}",
                    f"EndTime={_slurm_time(now + timedelta(seconds=1))}",
                ]
            )
            if done.returncode != 0:
                raise SlurmError(
                    f"scontrol update reservation {name}: {(done.stderr or done.stdout).strip()}"
                )
        logger.info("allocation %s: Slurm reservation %s ended", pk, name)
        ended.append(name)
    return ended
