from django.core.management.base import BaseCommand

from deliveries.api.filters import DeliverySelection, add_arguments, selected_by_options
from deliveries.models import Delivery


class Command(BaseCommand):
    help = (
        "Send finished deliveries again, chosen by ids or filters, e.g. "
        "--target 3 --status failed --since 2026-01-01T00:00. Pending and retrying "
        "ones are already on their way and stay as they are."
    )

    def add_arguments(self, parser):
        add_arguments(parser, DeliverySelection)

    def handle(self, *args, **options):
        deliveries, _ = selected_by_options(Delivery.objects.all(), DeliverySelection, options)
        matched = deliveries.count()
        queued = deliveries.redeliver()
        self.stdout.write(f"Queued {queued} deliveries for redelivery ({matched} matched).")
