from django.core.management.base import BaseCommand, CommandError

from audit.selectors import chain_verify


class Command(BaseCommand):
    help = "Verify the audit log's hash chain; exit non-zero naming the first bad event."

    def handle(self, *args, **options):
        report = chain_verify()
        if not report.ok:
            raise CommandError(report.describe())
        self.stdout.write(report.describe())
