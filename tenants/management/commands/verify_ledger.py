from django.core.management.base import BaseCommand, CommandError

from tenants.ledger import ledger_verify


class Command(BaseCommand):
    help = "Check every ledger invariant; exit non-zero with a report naming what is wrong."

    def handle(self, *args, **options):
        problems = ledger_verify()
        if problems:
            raise CommandError(
                f"ledger has {len(problems)} problem(s):\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
        self.stdout.write(
            "ledger clean: every transfer balances, balances match entries, "
            "no tenant account is negative, issued = held"
        )
