from django.core.management.base import BaseCommand, CommandError

from deliveries.retention import HOLD, VacuumRefused, prune_events, vacuum


class Command(BaseCommand):
    help = (
        "Delete events older than their webhook's retention_days, with their deliveries "
        "and results, in small batches. Events still being delivered are kept."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch",
            type=int,
            default=None,
            help="events per transaction (default: as many as take about "
            f"{HOLD * 1000:g} ms, measured as it goes)",
        )
        parser.add_argument(
            "--vacuum",
            action="store_true",
            help="SQLite: afterwards, rebuild the file once so that later prunes give "
            "space back (holds the writer lock throughout; needs free disk the size of "
            "the file, and free memory the size of its data with the bundled SQLite)",
        )

    def handle(self, *args, **options):
        batch = options["batch"]
        removed = prune_events(batch=None if batch is None else max(1, batch))
        self.stdout.write(
            f"Pruned {removed['events']} events, {removed['deliveries']} deliveries and "
            f"{removed['results']} attempt results."
        )
        if options["vacuum"]:
            try:
                vacuum()
            except VacuumRefused as exc:
                raise CommandError(f"Not vacuumed: {exc}.") from None
            self.stdout.write("Vacuumed.")
