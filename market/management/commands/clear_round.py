"""``gpumarket clear-round ROUND_ID``: close (if due), clear and settle one round now, the same
way the beat tick does. Safe to run while workers run: the round's row lock and status make it
settle once."""

from django.core.management.base import BaseCommand, CommandError

from market.errors import MarketError
from market.models import Round
from market.services.tick import round_process


class Command(BaseCommand):
    help = "Close (if due), clear and settle one round now; prints its status and prices."

    def add_arguments(self, parser):
        parser.add_argument("round_id", type=int)

    def handle(self, *args, round_id: int, **options):
        try:
            rnd = round_process(round_id=round_id)
        except Round.DoesNotExist as exc:
            raise CommandError(f"there is no round {round_id}") from exc
        except MarketError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"round {rnd.pk}: {rnd.status}")
        if rnd.status == Round.Status.FAILED:
            raise CommandError(f"round {rnd.pk} failed: {rnd.failure_reason}")
        for slug, price in sorted(rnd.prices.items()):
            self.stdout.write(f"  {slug}: {price} milli-credits/GPU-hour")
        self.stdout.write(f"  revenue: {rnd.revenue} milli-credits")
