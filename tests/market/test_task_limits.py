"""The tasks that close, clear and settle rounds have the time a very large round needs.

Every task had the same limits (soft 300 s): a million-bid round settles in one transaction
in 764 s on 2 cores (docs/market.md), so its tick was stopped mid-settlement, rolled back,
and the next tick began again: the round never settled.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from django.conf import settings

from market.tasks import round_clear_task, rounds_tick_task


def test_round_tasks_have_their_own_longer_limits():
    for task in (rounds_tick_task, round_clear_task):
        assert task.soft_time_limit == settings.GPUMARKET_ROUND_TASK_SOFT_TIME_LIMIT
        assert task.time_limit == settings.GPUMARKET_ROUND_TASK_TIME_LIMIT
        assert task.time_limit > task.soft_time_limit >= 30 * 60
        assert task.soft_time_limit > settings.CELERY_TASK_SOFT_TIME_LIMIT


def test_a_running_round_task_is_not_handed_to_another_worker(monkeypatch):
    # With late acknowledgement, the Redis broker hands a message that is not acknowledged
    # within the visibility timeout to another worker: by default it outlasts the longest task.
    # (The settings as a deployment on Redis reads them; the tests' own broker has no timeout.)
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
    for name in ("CELERY_BROKER_VISIBILITY_TIMEOUT", "GPUMARKET_ROUND_TASK_TIME_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    deployed = runpy.run_path(str(Path(settings.BASE_DIR) / "config" / "settings.py"))
    timeout = deployed["CELERY_BROKER_TRANSPORT_OPTIONS"]["visibility_timeout"]
    assert timeout > deployed["GPUMARKET_ROUND_TASK_TIME_LIMIT"] > 30 * 60
    assert timeout > deployed["CELERY_TASK_TIME_LIMIT"]
