from django.core.management.base import BaseCommand, CommandError

from deliveries.api.filters import EventSelection, add_arguments, selected_by_options
from deliveries.models import Event, Target


class Command(BaseCommand):
    help = (
        "Send events again to their targets, chosen by ids or filters, e.g. "
        "--webhook 2 --since 2026-01-01T00:00; with --target, only to that target "
        "(one added since, say)."
    )

    def add_arguments(self, parser):
        add_arguments(parser, EventSelection)
        parser.add_argument(
            "--target", type=int, help="only to this target, a target of the events' webhook"
        )

    def handle(self, *args, **options):
        events, chosen = selected_by_options(Event.objects.all(), EventSelection, options)
        target = None
        if options["target"] is not None:
            target = Target.objects.filter(pk=options["target"]).first()
            if target is None:
                raise CommandError(f"No target {options['target']}.")
            if chosen.get("webhook", target.webhook_id) != target.webhook_id:
                raise CommandError(
                    f"Target {target.pk} is not a target of webhook {chosen['webhook']}."
                )
        reset, created = events.replay(target=target)
        self.stdout.write(
            f"Queued {reset + created} deliveries: {reset} redelivered, {created} new."
        )
