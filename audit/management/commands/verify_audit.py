from django.core.management.base import BaseCommand, CommandError

from audit.checkpoints import CheckpointError, checkpoint_store_problem, checkpoints_read
from audit.selectors import chain_verify


class Command(BaseCommand):
    help = (
        "Verify the audit log's hash chain against the signed checkpoints; exit non-zero naming "
        "the first bad event, or when the checkpoint file is missing, empty or behind."
    )

    def handle(self, *args, **options):
        report = chain_verify()
        if not report.ok:
            raise CommandError(report.describe())
        try:
            problem = checkpoint_store_problem(checkpoints_read())
        except CheckpointError as exc:  # chain_verify reads the same lines; kept for a race
            raise CommandError(str(exc)) from None
        if problem:
            raise CommandError(f"{report.describe()}, but {problem}")
        self.stdout.write(report.describe())
