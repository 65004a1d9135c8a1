import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from deliveries import replays
from deliveries.api.filters import EventSelection, add_arguments, selected_by_options
from deliveries.models import Delivery, Event, Target, Webhook

# What only a replay job selects by, and what only the immediate replay does.
JOB_ONLY = ("from_target", "statuses")
IMMEDIATE_ONLY = ("ids", "entrypoint", "code", "provider_id")
# The option that gave each of the job's fields (and option dests that differ).
FLAGS = {"target": "--from-target", "to_target": "--target", "statuses": "--status"}
FLAGS["from_target"] = FLAGS["target"]


def flag(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


class Command(BaseCommand):
    help = (
        "Send events again. A time window of one webhook (--webhook 2 --since "
        "2026-01-01T00:00 [--until ...]) starts a replay job that the engines run, "
        "paced by each target's rate limit; --wait follows it. Events chosen by --ids, "
        "--code, --provider-id or --entrypoint are queued at once (small selections). "
        "--dry-run counts and changes nothing."
    )

    def add_arguments(self, parser):
        add_arguments(parser, EventSelection)
        parser.add_argument(
            "--target",
            "--to-target",
            dest="target",
            type=int,
            help="send only to this target of the webhook (one added since, say); a job "
            "creates the deliveries it lacks (the API's to_target)",
        )
        parser.add_argument(
            "--from-target",
            type=int,
            help="job: only the events' deliveries to this target (the API's target)",
        )
        parser.add_argument(
            "--status",
            dest="statuses",
            action="append",
            choices=Delivery.Status.values,
            help="job: only deliveries in this status (repeat for several); "
            "default: every finished one",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print how many would be sent; change nothing"
        )
        parser.add_argument(
            "--wait", action="store_true", help="job: print its progress until it ends"
        )

    def handle(self, *args, **options):
        events, chosen = selected_by_options(Event.objects.all(), EventSelection, options)
        target = self.target(options["target"], chosen.get("webhook"))
        windowed = "webhook" in chosen and "since" in chosen
        if windowed and not any(name in chosen for name in IMMEDIATE_ONLY):
            return self.job(chosen, target, options)
        named = [name for name in JOB_ONLY if options[name]]
        if named:
            flags = ", ".join(map(flag, named))
            raise CommandError(f"{flags}: only for a replay job (--webhook and --since alone).")
        if options["dry_run"]:
            self.stdout.write(f"Would send {events.count()} events again.")
            return
        reset, created = events.replay(target=target)
        self.stdout.write(
            f"Queued {reset + created} deliveries: {reset} redelivered, {created} new."
        )

    def target(self, pk, webhook_id):
        if pk is None:
            return None
        target = Target.objects.filter(pk=pk).first()
        if target is None:
            raise CommandError(f"No target {pk}.")
        if webhook_id is not None and webhook_id != target.webhook_id:
            raise CommandError(f"Target {target.pk} is not a target of webhook {webhook_id}.")
        return target

    def job(self, chosen, to_target, options):
        webhook = Webhook.objects.filter(pk=chosen["webhook"]).first()
        if webhook is None:
            raise CommandError(f"No webhook {chosen['webhook']}.")
        criteria = replays.Criteria(
            webhook,
            chosen["since"],
            chosen.get("until") or timezone.now(),
            target=self.target(options["from_target"], webhook.pk),
            statuses=tuple(options["statuses"] or ()),
            to_target=to_target,
        )
        try:
            if options["dry_run"]:
                criteria.clean()
                self.stdout.write(f"Would send {criteria.count()} deliveries again.")
                return
            job = replays.start(criteria)
        except ValidationError as error:
            raise CommandError(
                " ".join(
                    f"{flag(field)}: {' '.join(messages)}"
                    for field, messages in error.message_dict.items()
                )
            ) from None
        self.stdout.write(
            f"Replay job {job.pk} started ({criteria.count()} deliveries to send); "
            "the engines run it."
        )
        if options["wait"]:
            self.follow(job)

    def follow(self, job, every=1.0):
        """Print the job's progress as it changes, until it ends."""
        shown = None
        while True:
            job.refresh_from_db()
            line = (
                f"{job.state}: matched {job.matched}, queued {job.queued}, "
                f"delivered {job.delivered}, failed {job.failed}"
            )
            if line != shown:
                self.stdout.write(line)
                shown = line
            if job.is_over():
                return
            time.sleep(every)
