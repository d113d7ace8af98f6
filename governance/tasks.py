from celery import shared_task

from governance.services import changes_expire


@shared_task(name="governance.approvals_expire")
def approvals_expire() -> int:
    return changes_expire()
