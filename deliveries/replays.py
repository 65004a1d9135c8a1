"""Replay jobs: send again what a webhook received in a time range, as a job the
engines run, with a dry run, progress, pause, resume and cancel
(docs/architecture.md, Replay jobs).

A job is planned once, in batches of PLAN_BATCH: each batch's ReplayItems (same
targets: one per matched delivery; `to_target`: one per matched event), its share
of `matched` and the key it ended at are one transaction, so planning resumes
exactly where it stopped, and what a job sends is fixed as it is planned and
survives restarts; no transaction holds SQLite's writer for more than a batch.
Items planned are queued while the rest is planned. In small transactions, each
target's next items are queued: the delivery set
back to pending (or created, for a `to_target` with none), the item marked queued
and the job's count raised together, so a crash anywhere queues nothing twice and
skips nothing. At most `REPLAY_WINDOW` of a job's deliveries to one target are
queued and unfinished at a time: the engine's own rate limit, breaker and per-target
gate pace them, live events keep their turn, and a pause or cancel lets at most that
window finish (like EventBridge's CancelReplay: what is on its way completes).
Queued items are settled (done, with how their delivery ended) as the engine
finishes them. A job over, its items are deleted a batch at a time (the counts stay).

Who runs what, on PostgreSQL with many engines: the engine owning partition
`job id % count` plans a job; the engine owning a target's partition queues and
settles that target's items. Rows are taken with SKIP LOCKED and counts moved by
conditional updates, so two engines crossing at a hand-over cannot count or queue
one item twice.
"""

import dataclasses
import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery
from django.utils import timezone

from deliveries import wake
from deliveries.engine.partitions import in_partitions
from deliveries.models import Delivery, Event, ReplayItem, ReplayJob, Target

Item = ReplayItem.State
# Items planned per transaction, and deleted per transaction once a job is over.
PLAN_BATCH = 2000
TIDY_BATCH = 5000


@dataclasses.dataclass(frozen=True)
class Criteria:
    """What a job (or its dry run) selects; `clean()` checks it."""

    webhook: object  # Webhook
    since: datetime.datetime
    until: datetime.datetime
    target: Target | None = None
    statuses: tuple = ()
    to_target: Target | None = None

    @classmethod
    def of(cls, job: ReplayJob) -> "Criteria":
        return cls(
            job.webhook,
            job.since,
            job.until,
            job.target,
            tuple(job.statuses),
            job.to_target,
        )

    def clean(self) -> None:
        """ValidationError, by field, for what cannot be replayed."""
        errors = {}
        if self.since >= self.until:
            errors["until"] = "Must be after since."
        for field in ("target", "to_target"):
            target = getattr(self, field)
            if target is not None and target.webhook_id != self.webhook.pk:
                errors[field] = f"Target {target.pk} is not a target of webhook {self.webhook.pk}."
        known = set(Delivery.Status.values)
        unknown = sorted(set(self.statuses) - known)
        if unknown:
            errors["statuses"] = f"Unknown status: {', '.join(unknown)}."
        elif self.to_target is None and set(self.statuses) - set(Delivery.FINISHED):
            errors["statuses"] = (
                "Pending and retrying deliveries are already on their way: choose among "
                f"{', '.join(Delivery.FINISHED)}, or send them to another target."
            )
        if self.to_target is not None and not self.to_target.active:
            errors["to_target"] = "This target is inactive: activate it first."
        if errors:
            raise ValidationError(errors)

    def deliveries(self):
        """The webhook's deliveries the criteria select (of events in the range)."""
        deliveries = Delivery.objects.filter(
            event__webhook_id=self.webhook.pk,
            event__received_at__gte=self.since,
            event__received_at__lt=self.until,
        )
        if self.target is not None:
            deliveries = deliveries.filter(target_id=self.target.pk)
        if self.statuses:
            deliveries = deliveries.filter(status__in=self.statuses)
        return deliveries

    def selected(self):
        """Same targets: the finished deliveries selected. To a target: the events
        in the range (with a selected delivery, when a target or statuses are given)."""
        if self.to_target is None:
            # Not to an inactive target: nothing would send them.
            deliveries = self.deliveries().filter(target__active=True)
            if self.statuses:
                return deliveries
            return deliveries.filter(status__in=Delivery.FINISHED)
        events = Event.objects.filter(
            webhook_id=self.webhook.pk, received_at__gte=self.since, received_at__lt=self.until
        )
        if self.target is not None or self.statuses:
            events = events.filter(Exists(self.deliveries().filter(event=OuterRef("pk"))))
        return events

    def count(self) -> int:
        """The dry run: how many deliveries a job started now would send."""
        return self.selected().count()

    def rows(self, after: tuple[int, int] = (0, 0)):
        """(event id, target id, delivery id or None) for each item, in the order
        they are sent (as received: by event id, then target), after the (event,
        target) key `after`."""
        event, target = after
        if self.to_target is None:
            return (
                self.selected()
                # The >= is the bound an index range starts from; the OR is exact.
                .filter(event_id__gte=event)
                .filter(Q(event_id__gt=event) | Q(event_id=event, target_id__gt=target))
                .order_by("event_id", "target_id")
                .values_list("event_id", "target_id", "pk")
            )
        existing = to_target(self.to_target.pk).filter(event=OuterRef("pk"))
        return (
            self.selected()
            .filter(pk__gt=event)
            .order_by("pk")
            .annotate(
                replay_target=models.Value(self.to_target.pk),
                replay_delivery=models.Subquery(existing.values("pk")[:1]),
            )
            .values_list("pk", "replay_target", "replay_delivery")
        )


def to_target(target_id: int):
    """The deliveries to a target, for a lookup by event (event, target is unique).

    The comparison is on `target_id + 0`, which no index serves: the planner then
    goes by the event. A replay to a new target makes thousands of its deliveries
    before PostgreSQL's statistics see them; compared plainly, the planner takes
    the target's own index for the smaller (it counts none), and scans every
    delivery made so far for each event looked up."""
    return Delivery.objects.alias(to=F("target_id") + 0).filter(to=target_id).order_by()


def start(criteria: Criteria, user=None) -> ReplayJob:
    """Create the job (checked); the engines plan and run it. Its window ends now
    at the latest: events received while it is planned are not in it (they are
    being delivered as they come)."""
    criteria.clean()
    now = timezone.now()
    with transaction.atomic():
        job = ReplayJob.objects.create(
            webhook=criteria.webhook,
            since=criteria.since,
            until=min(criteria.until, now),
            created_at=now,
            target=criteria.target,
            statuses=list(criteria.statuses),
            to_target=criteria.to_target,
            created_by=user if user is not None and user.is_authenticated else None,
        )
        wake.notify_on_commit(connection)
    return job


# --- what the engine does (deliveries/engine/runner.py runs step) -----------------


def step(claimable, count: int, window: int | None = None) -> int:
    """One turn over the jobs with work in this engine's partitions. Returns how
    much it did (items planned, queued, settled or deleted), 0 when nothing."""
    window = settings.REPLAY_WINDOW if window is None else window
    done = 0
    # Beside the active ones: paused jobs with deliveries on their way (counted as
    # they end), and jobs over or cancelled with items left.
    items = ReplayItem.objects.filter(job=OuterRef("pk"))
    jobs = ReplayJob.objects.filter(
        Q(state__in=ReplayJob.ACTIVE)
        | (Q(state=ReplayJob.State.PAUSED) & Exists(items.filter(state=Item.QUEUED)))
        | (Q(state__in=ReplayJob.FINISHED) & Exists(items))
    ).values_list("pk", "state")
    for pk, state in list(jobs):
        mine = count <= 1 or pk % count in claimable  # the job's own partition
        if state == ReplayJob.State.PLANNING and mine:
            done += plan(pk)
        if state != ReplayJob.State.DONE:
            done += settle(pk, claimable, count)
        if state in ReplayJob.ACTIVE:
            done += top_up(pk, claimable, count, window)
        if state == ReplayJob.State.RUNNING:
            finish(pk)
        elif state in ReplayJob.FINISHED and mine:
            done += tidy(pk)
    return done


def plan(job_id: int) -> int:
    """Plan the job's next batch: its items, its share of `matched` and where it
    ended, in one transaction; the last batch makes the job `running`. Returns
    the items planned (at least 1 when the job moved)."""
    job = (
        ReplayJob.objects.select_related("webhook", "target", "to_target")
        .filter(pk=job_id, state=ReplayJob.State.PLANNING)
        .first()
    )
    if job is None:
        return 0
    after = (job.plan_event, job.plan_target)
    # Read before the transaction: on SQLite a transaction holds the one writer
    # from its BEGIN.
    rows = list(Criteria.of(job).rows(after)[:PLAN_BATCH])
    last = len(rows) < PLAN_BATCH
    moved = {
        "matched": F("matched") + len(rows),
        "plan_event": rows[-1][0] if rows else after[0],
        "plan_target": rows[-1][1] if rows else after[1],
    }
    if last:
        moved.update(state=ReplayJob.State.RUNNING, planned_at=timezone.now())
    try:
        with transaction.atomic():
            # Conditional on the key it read: a pause, a cancel or another engine's
            # batch committed meanwhile, and this batch is not written.
            if not ReplayJob.objects.filter(
                pk=job_id,
                state=ReplayJob.State.PLANNING,
                plan_event=after[0],
                plan_target=after[1],
            ).update(**moved):
                return 0
            ReplayItem.objects.bulk_create(
                ReplayItem(job_id=job_id, event_id=e, target_id=t, delivery_id=d)
                for e, t, d in rows
            )
    except IntegrityError:
        # A row of the batch was deleted since it was read (retention, a user):
        # nothing was written; the next step reads the batch again without it.
        return 0
    return max(len(rows), 1)


def _items(job_id: int, state, claimable, count):
    return in_partitions(ReplayItem.objects.filter(job_id=job_id, state=state), claimable, count)


def settle(job_id: int, claimable, count: int) -> int:
    """Mark the queued items whose delivery has finished, counting how each ended."""
    ended = list(
        _items(job_id, Item.QUEUED, claimable, count)
        .filter(delivery__status__in=Delivery.FINISHED)
        .values_list("pk", "delivery__status")
    )
    if not ended:
        return 0
    by_status: dict[str, list[int]] = {}
    for pk, status in ended:
        by_status.setdefault(status, []).append(pk)
    with transaction.atomic():
        counts = {}
        for status, pks in by_status.items():
            # Conditional: an item another engine settled meanwhile is not counted twice.
            counts[status] = ReplayItem.objects.filter(pk__in=pks, state=Item.QUEUED).update(
                state=Item.DONE, outcome=status
            )
        ReplayJob.objects.filter(pk=job_id).update(
            **{status: F(status) + n for status, n in counts.items() if n}
        )
    return len(ended)


def top_up(job_id: int, claimable, count: int, window: int) -> int:
    """Queue each of this engine's targets' next items, up to `window` unfinished.
    A paused target's items wait for its resume; an inactive one's are skipped
    (its deliveries would wait in the database for ever)."""
    waiting = _items(job_id, Item.WAITING, claimable, count)
    targets = [t for t in _waiting_targets(job_id) if count <= 1 or t % count in claimable]
    if not targets:
        return 0
    held = dict(
        Target.objects.filter(pk__in=targets)
        .exclude(active=True, paused=False)
        .values_list("pk", "active")
    )
    inactive = [t for t, active in held.items() if not active]
    if inactive:
        with transaction.atomic():
            # Only while it runs (the job's row locked): a cancelled job's items
            # are tidied away, not counted.
            if (
                ReplayJob.objects.select_for_update()
                .filter(pk=job_id, state__in=ReplayJob.ACTIVE)
                .exists()
            ):
                skipped = waiting.filter(target_id__in=inactive).update(
                    state=Item.DONE, outcome="skipped"
                )
                ReplayJob.objects.filter(pk=job_id).update(skipped=F("skipped") + skipped)
    targets = [t for t in targets if t not in held]
    busy = dict(
        _items(job_id, Item.QUEUED, claimable, count)
        .filter(target_id__in=targets)
        .values_list("target_id")
        .annotate(n=Count("pk"))
        .values_list("target_id", "n")
    )
    queued = 0
    for target_id in targets:
        room = window - busy.get(target_id, 0)
        if room > 0:
            queued += _queue(job_id, target_id, room)
    return queued + len(inactive)


# The distinct targets of a job's waiting items, one index probe per target along
# replay_item_idx (job, state, target, id): a loose index scan, which neither
# SQLite nor PostgreSQL plans for a DISTINCT on their own (they read every waiting
# item, every step, while a job of 100 000 runs).
WAITING_TARGETS = """
WITH RECURSIVE waiting(target) AS (
    SELECT MIN(target_id) FROM {table} WHERE job_id = %s AND state = %s
    UNION ALL
    SELECT (SELECT MIN(target_id) FROM {table}
            WHERE job_id = %s AND state = %s AND target_id > waiting.target)
    FROM waiting WHERE waiting.target IS NOT NULL
)
SELECT target FROM waiting WHERE target IS NOT NULL
"""


def _waiting_targets(job_id: int) -> list[int]:
    sql = WAITING_TARGETS.format(table=connection.ops.quote_name(ReplayItem._meta.db_table))
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id, Item.WAITING, job_id, Item.WAITING])
        return [row[0] for row in cursor.fetchall()]


def _queue(job_id: int, target_id: int, room: int) -> int:
    with transaction.atomic():
        # The job's row, locked: a pause or cancel committed before this reads
        # stops it; one arriving now waits for this batch (PostgreSQL). SQLite
        # has one writer, which orders them the same way.
        job = (
            ReplayJob.objects.select_for_update()
            .filter(pk=job_id, state__in=ReplayJob.ACTIVE)
            .values("to_target_id")
            .first()
        )
        if job is None:
            return 0
        items = list(
            ReplayItem.objects.select_for_update(skip_locked=True)
            .filter(job_id=job_id, state=Item.WAITING, target_id=target_id)
            .order_by("id")
            .values_list("pk", "event_id", "delivery_id")[:room]
        )
        if not items:
            return 0
        now = timezone.now()
        created = set()
        if job["to_target_id"] is not None:
            items, created = _create_missing(items, target_id, now)
        statuses = dict(
            Delivery.objects.filter(pk__in=[d for _, _, d in items]).values_list("pk", "status")
        )
        # Finished: set back to pending. Created now: pending already. Anything
        # else is on its way already (or gone): skipped, not sent twice.
        started = [
            (pk, d) for pk, _, d in items if d in created or statuses.get(d) in Delivery.FINISHED
        ]
        Delivery.objects.filter(pk__in=[d for _, d in started]).set_pending(now)
        begun = {pk for pk, _ in started}
        skipped = [pk for pk, _, _ in items if pk not in begun]
        # One UPDATE for the window, not a CASE per row (bulk_update): an item
        # whose delivery was made just now gets it from the (event, target) key.
        made = {pk for pk, d in started if d in created}
        ReplayItem.objects.filter(pk__in=begun - made).update(state=Item.QUEUED)
        if made:
            ReplayItem.objects.filter(pk__in=made).update(
                state=Item.QUEUED,
                delivery_id=Subquery(
                    to_target(target_id).filter(event_id=OuterRef("event_id")).values("pk")[:1]
                ),
            )
        ReplayItem.objects.filter(pk__in=skipped).update(state=Item.DONE, outcome="skipped")
        ReplayJob.objects.filter(pk=job_id).update(
            queued=F("queued") + len(started), skipped=F("skipped") + len(skipped)
        )
        if started:
            wake.notify_on_commit(connection)
    return len(items)


def _create_missing(items, target_id: int, now) -> tuple[list, set]:
    """A to_target job's items with their deliveries to the target, one created
    (pending) for each event that had none; and the ids of those created."""
    missing = [event_id for _, event_id, d in items if d is None]
    if not missing:
        return items, set()
    Delivery.objects.bulk_create(
        [
            Delivery(event_id=e, target_id=target_id, created_at=now, updated_at=now)
            for e in missing
        ],
        ignore_conflicts=True,
    )
    found = dict(to_target(target_id).filter(event_id__in=missing).values_list("event_id", "pk"))
    items = [(pk, e, d if d is not None else found.get(e)) for pk, e, d in items]
    return items, set(found.values())


def finish(job_id: int) -> None:
    """A running job with every item done is done."""
    ReplayJob.objects.filter(pk=job_id, state=ReplayJob.State.RUNNING).exclude(
        Exists(ReplayItem.objects.filter(job=OuterRef("pk"), state__lt=Item.DONE))
    ).update(state=ReplayJob.State.DONE, finished_at=timezone.now())


def tidy(job_id: int) -> int:
    """Delete a batch of the items of a job done or cancelled (a cancelled job's
    queued ones stay until they are settled). Returns how many."""
    pks = list(
        ReplayItem.objects.filter(job_id=job_id)
        .exclude(state=Item.QUEUED)
        .values_list("pk", flat=True)[:TIDY_BATCH]
    )
    if pks:
        ReplayItem.objects.filter(pk__in=pks).delete()
    return len(pks)


# --- what a user does (console, API, command) -------------------------------------


def pause(job: ReplayJob) -> bool:
    """Stop queuing; what is queued finishes. False if the job is not active."""
    return bool(
        ReplayJob.objects.filter(pk=job.pk, state__in=ReplayJob.ACTIVE).update(
            state=ReplayJob.State.PAUSED
        )
    )


def resume(job: ReplayJob) -> bool:
    """Go on where it stopped (or plan it, if it was paused before planning)."""
    with transaction.atomic():
        resumed = ReplayJob.objects.filter(pk=job.pk, state=ReplayJob.State.PAUSED).update(
            state=models.Case(
                models.When(planned_at__isnull=True, then=models.Value(ReplayJob.State.PLANNING)),
                default=models.Value(ReplayJob.State.RUNNING),
            )
        )
        if resumed:
            wake.notify_on_commit(connection)
    return bool(resumed)


def cancel(job: ReplayJob) -> bool:
    """Stop for good: nothing more is queued, what is queued finishes and is counted;
    the engines delete the rest of its items."""
    with transaction.atomic():
        cancelled = ReplayJob.objects.filter(
            pk=job.pk, state__in=(*ReplayJob.ACTIVE, ReplayJob.State.PAUSED)
        ).update(state=ReplayJob.State.CANCELLED, finished_at=timezone.now())
        if cancelled:
            wake.notify_on_commit(connection)
    return bool(cancelled)
