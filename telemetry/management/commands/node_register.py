"""``gpumarket node-register NAME --tier SLUG``: register a node and print its token once."""

from django.core.management.base import BaseCommand, CommandError

from market.models import Tier
from telemetry.errors import TelemetryError
from telemetry.services import node_register


class Command(BaseCommand):
    help = "Register a GPU node; prints its token (shown only once) for the agent."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--tier", required=True, help="slug of the tier its GPUs join")

    def handle(self, *args, name: str, tier: str, **options):
        found = Tier.objects.filter(slug=tier).first()
        if found is None:
            slugs = ", ".join(Tier.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no tier {tier!r}; existing tiers: {slugs}")
        try:
            node, token = node_register(name=name, tier=found, actor="cli")
        except TelemetryError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"registered node {node.name} in tier {found.slug}; its token:")
        self.stdout.write(token)
