"""The recovery routine: one function, run at start and then on every tick.

At start it takes every pending and retrying delivery: whatever a dead predecessor
owned is in nobody's inflight set now. On a tick it takes pending deliveries nobody
has touched for DELIVERY_STALE_AFTER, and retrying ones whose retry was due that
long ago, at most DELIVERY_RECOVERY_BATCH: the ones every other path missed (a gap
that outlived its wait, a wake-up lost while the poll was slow, a retry whose owner
lost it). Either way it skips what the inflight set holds, so it never
re-dispatches a delivery the engine is already working on, however long that one
has been waiting in the channel.

A retrying delivery is claimed before its event is read (claims.Claimer), then
scheduled for what is left of its backoff (`next_attempt_at`), now if nothing is.
"""

import datetime

from django.db.models import Q
from django.utils import timezone

from deliveries.engine.claims import CANDIDATE_FIELDS
from deliveries.models import Delivery

# Rows read per query while looking for unowned ones. No index holds the
# unfinished rows of both statuses in (updated_at, id) order, so each page sorts
# them again: a backlog is read in few, large pages.
PAGE = 2000
# A tick reads at most this many pages (20 000 rows): many stale rows can be owned
# (a deep, healthy channel), and the tick must stay cheap all the same.
MAX_TICK_PAGES = 10


def recover(
    *,
    claimer,
    dispatch,
    room,
    at_start: bool,
    stale_after: float,
    batch: int,
    now=None,
    stopping=lambda: False,
    narrow=lambda queryset: queryset,
) -> int:
    """Claim and dispatch what nobody owns; return how many tasks were dispatched.

    `room()` says how many more tasks the channel takes: pending deliveries beyond
    it are left for intake and later ticks. Retrying ones go to the scheduler and
    do not count against it. `narrow(queryset)` limits the rows read to the
    partitions wanted (partitions.Partitions.filter).
    """
    now = now or timezone.now()
    if at_start:
        queryset, limit, max_pages = Delivery.objects.unfinished(), None, None
    else:
        cutoff = now - datetime.timedelta(seconds=stale_after)
        queryset, limit, max_pages = Delivery.objects.stale(cutoff), batch, MAX_TICK_PAGES
    # A held (paused, inactive) target's rows are the oldest untouched ones there
    # are: read, they would fill every page of a tick and hide the rows it exists
    # to find. They are read again when the target is resumed.
    queryset = narrow(queryset.filter(target__paused=False, target__active=True))
    dispatched = pages = 0
    last = None
    while (max_pages is None or pages < max_pages) and not stopping():
        pages += 1
        capacity = room()
        if at_start and capacity <= 0:
            # The channel is full: the pending rest is intake's (its cursor starts
            # below the oldest unfinished row); only retrying rows remain to schedule.
            queryset = queryset.filter(status=Delivery.Status.RETRYING)
        page = queryset.order_by("updated_at", "id")
        if last is not None:
            page = page.filter(Q(updated_at__gt=last[0]) | Q(updated_at=last[0], id__gt=last[1]))
        rows = list(page.values_list(*CANDIDATE_FIELDS, "updated_at")[:PAGE])
        if not rows:
            break
        last = (rows[-1][-1], rows[-1][0])
        candidates = []
        for row in rows:
            if row[1] == Delivery.Status.PENDING:
                if capacity <= 0:
                    continue
                capacity -= 1
            candidates.append(row[:-1])
        left = None if limit is None else limit - dispatched
        for task in claimer.claim(candidates, left):
            dispatch(task)
            dispatched += 1
        if (limit is not None and dispatched >= limit) or len(rows) < PAGE:
            break
    return dispatched
