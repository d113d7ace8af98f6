"""Beat's audit tick: export a signed checkpoint of the log's head."""

from __future__ import annotations

from celery import shared_task

from audit.checkpoints import checkpoint_write


@shared_task(name="audit.checkpoint")
def checkpoint() -> int | None:
    written = checkpoint_write()
    return written.seq if written else None
