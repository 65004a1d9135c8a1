from django.core.management.base import BaseCommand

from deliveries.retention import BATCH, prune_events, vacuum


class Command(BaseCommand):
    help = (
        "Delete events older than their webhook's retention_days, with their deliveries "
        "and results, in small batches. Events still being delivered are kept."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch", type=int, default=BATCH, help="events per transaction (default: %(default)r)"
        )
        parser.add_argument(
            "--vacuum",
            action="store_true",
            help="SQLite: afterwards, rebuild the file once so that later prunes give "
            "space back (holds the writer lock throughout; needs free disk the size of "
            "the file)",
        )

    def handle(self, *args, **options):
        removed = prune_events(batch=max(1, options["batch"]))
        self.stdout.write(
            f"Pruned {removed['events']} events, {removed['deliveries']} deliveries and "
            f"{removed['results']} attempt results."
        )
        if options["vacuum"]:
            vacuum()
            self.stdout.write("Vacuumed.")
