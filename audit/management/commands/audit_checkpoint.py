from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_write


class Command(BaseCommand):
    help = (
        "Append a signed checkpoint of the audit log's head to GPUMARKET_AUDIT_CHECKPOINT_PATH "
        "(beat does this every minute); verify-audit checks the log against them."
    )

    def handle(self, *args, **options):
        written = checkpoint_write()
        if written is None:
            self.stdout.write("no new checkpoint: the head has not moved since the last one")
        else:
            self.stdout.write(f"checkpoint written: seq {written.seq}, hash {written.hash}")
