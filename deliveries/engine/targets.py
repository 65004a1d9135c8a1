"""Everything one engine keeps about each target, in one object per target.

`Targets` (the engine's `targets`) maps target ids to `EngineTarget`s, made when a
claim first meets the target and dropped when the target is deleted. Each holds:

* `row`: the target as it is in the database (`TargetState`). Every attempt uses
  it as it is now (a URL changed, a target paused, deactivated or deleted takes
  effect on the next attempt, not after the delivery ends) without a query per
  attempt: `refresh()` checks every known target's `updated_at` (its version) in
  one query at most every REFRESH seconds (and when woken, as after a pause or
  resume), and before an attempt whenever its last check began over FRESH seconds
  ago (`stale()`): a change committed FRESH seconds ago is in every attempt begun
  since, which is what a secret rotation's answer waits for
  (Target.until_engines_see_changes).
* its gate (invariant 7 in docs/architecture.md): how many of its deliveries the
  engine holds in memory (`hold`, capped by `max_queue_size`) and how many attempts
  it has running (`enter`, capped by DELIVERY_TARGET_CONCURRENCY). A worker that
  picks up a task whose target has its share running parks it here, still owned;
  the worker finishing one of its attempts takes it next (`leave`), or an attempt
  completing in flight puts it back on the channel (`vacate`). So a slow or dead
  target holds at most its share of attempts, and its excess waits.
* its overflow: the lowest delivery id left in the database because the target
  was full; intake reads them back from there once it has room.
* its ordered lane (ordered targets: one delivery at a time, in event order).
  Intake, recovery and the overflow drain never claim an ordered target's rows
  as they come; they note its lane, and intake reads its head (its unfinished
  delivery of the oldest event, by event id) and claims that alone.
  The head holds the lane through its retries; when it is released the next head
  is read: by the writer's thread as soon as the result commits, or by the next
  intake pass. `begin_head` lets one thread read a head at a time, and none while
  a head is in flight. A head that fails for good stops the line.
* what decides whether an attempt goes now (`admit`): its circuit breaker
  (breaker.py, for targets that retry) and its rate limit (attempts per second:
  each attempt reserves the next free slot, 1/rate apart; over any span the target
  sees at most rate * span + 1 attempts).

`forget()` drops what the engine has learnt of the receiver and the lane (breaker,
rate slot, lane, overflow) and hands back the parked tasks: for a target paused,
deactivated, deleted, re-ordered, or in a partition handed over. The row and the
gate's counts stay: the attempts running still finish and leave.

Lookups (`get`) take no lock: a dict lookup is atomic. Everything else one
target's object changes is changed under the registry's one lock.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import deque

from django.utils import timezone

from deliveries.engine.breaker import CircuitBreaker
from deliveries.models import Target
from deliveries.targets import TARGET_TYPES
from webhooker import encryption

# The Target columns an attempt depends on. A target type that needs another
# column (a signing secret, say) adds it here and reads task.target.<name>.
FIELDS = (
    "id",
    "type",
    "config",
    "max_retries",
    "retry_schedule",
    "active",
    "paused",
    "ordered",
    "rate_limit",
    "filters",
    "transform",
    "failing_since",
    "updated_at",
    # Whether an http target sends the attempt's traceparent (deliveries/tracing.py).
    "traceparent",
    # The http target's Standard Webhooks signing (deliveries/signing.py).
    "signing",
    "signing_secret",
    "previous_signing_secret",
    "secret_rotated_at",
)


class TargetState:
    """One target's row as of its `updated_at`; replaced whole, never changed."""

    __slots__ = (*FIELDS, "unreadable")

    def __init__(self, row: dict):
        for name in FIELDS:
            object.__setattr__(self, name, row[name])
        # Asked on every attempt; the row never changes.
        object.__setattr__(self, "unreadable", self._unreadable())

    def __setattr__(self, name, value):
        raise AttributeError("a TargetState is replaced, not changed")

    def __repr__(self):
        return f"<TargetState {self.id} {self.type} v{self.updated_at:%H:%M:%S.%f}>"

    def _unreadable(self) -> str:
        """Which of its stored secrets no encryption key opens, in words ("" if none)."""
        if encryption.unreadable(self.config):
            return "the target's configuration"
        if encryption.unreadable(self.signing_secret, self.previous_signing_secret):
            return "the target's signing secret"
        return ""

    @property
    def held(self) -> bool:
        """Paused or inactive: its deliveries wait in the database, unattempted."""
        return self.paused or not self.active

    @property
    def retries(self) -> bool:
        """Whether max_retries, backoff and the circuit breaker apply."""
        kind = TARGET_TYPES.get(self.type)
        return kind is not None and kind.retries and (self.max_retries > 0 or self.retry_schedule)


# What a changed row asks of the engine (Targets.refresh): drop the target's work
# from memory (GONE, HELD), read its deliveries again (RESUMED), both (REORDERED),
# or send what waited for its breaker (REPOINTED: a fresh breaker).
GONE, HELD, RESUMED, REORDERED, REPOINTED = "gone", "held", "resumed", "reordered", "repointed"


class EngineTarget:
    """One target as this engine knows it. Its fields change under the registry's
    lock (the breaker has its own)."""

    __slots__ = (
        "_targets",
        "breaker",
        "head",
        "held",
        "id",
        "lane_waiting",
        "next_slot",
        "overflow_from",
        "parked",
        "reading",
        "row",
        "running",
    )

    def __init__(self, row: TargetState, targets: Targets):
        self.id = row.id
        self.row = row
        self.breaker: CircuitBreaker | None = None  # made when first needed
        self.next_slot: float | None = None  # its next free rate-limit slot (clock time)
        self.held = 0  # its tasks in memory
        self.running = 0  # its attempts running
        self.parked: deque = deque()
        self.overflow_from: int | None = None
        self.lane_waiting = False  # its next head is to be read
        self.head: int | None = None  # the head delivery in flight
        self.reading = False  # a thread is reading its head
        self._targets = targets

    def __repr__(self):
        return f"<EngineTarget {self.id} held={self.held} running={self.running}>"

    def admit(self, task, now: float) -> float | None:
        """Whether the task's attempt goes now (None), or the clock time it is to
        come back: when the breaker lets it (`task.deferred`: a probe that gets
        through sends it sooner) or when its rate-limit slot comes (`task.slotted`:
        the slot is its, attempted when it comes). Asked once the lease is
        confirmed. A probe the task takes is its to send or give back
        (`give_back_probe`); `task.breaker` hears the attempt's outcome."""
        task.breaker = breaker = self.circuit_breaker() if self.row.retries else None
        if breaker is not None:
            retry_at, task.probing = breaker.admit()
            if retry_at is not None:
                task.deferred = True  # ownership kept, no attempt counted
                return retry_at
        task.deferred = False
        rate = self.row.rate_limit
        if rate > 0 and not task.slotted:
            with self._targets._lock:
                slot = now if self.next_slot is None else max(now, self.next_slot)
                self.next_slot = slot + 1.0 / rate
            if slot > now:
                task.slotted = True
                give_back_probe(task)
                return slot
        task.slotted = False
        return None

    def hold(self, cap: int) -> bool:
        """Count one more of its tasks in memory, unless it holds `cap` already."""
        with self._targets._lock:
            if self.held >= cap:
                return False
            self.held += 1
            return True

    def forget(self) -> list:
        """Drop what the engine learnt of the receiver and the lane (breaker, rate
        slot, lane, overflow); return the parked tasks, for the caller to release.
        A head in flight stays the head until it is released."""
        targets = self._targets
        with targets._lock:
            self.breaker = self.next_slot = self.overflow_from = None
            self.lane_waiting = False
            targets._overflowing.discard(self.id)
            targets._lanes.discard(self.id)
            parked, self.parked = list(self.parked), deque()
            return parked

    def circuit_breaker(self) -> CircuitBreaker:
        """Its breaker, made on first use (and again after forget() or a re-point)."""
        breaker = self.breaker
        if breaker is None:
            with self._targets._lock:
                if self.breaker is None:
                    self.breaker = self._targets.new_breaker()
                breaker = self.breaker
        return breaker


def give_back_probe(task) -> None:
    """The task holds its breaker's probe and is not sent now: the next attempt
    probes instead (never the task that is not sending it)."""
    if task.probing:
        task.probing = False
        task.breaker.abandon()


class Targets:
    REFRESH = 0.5
    FRESH = Target.ENGINE_FRESHNESS
    # Target ids per query when checking versions.
    CHUNK = 1000

    def __init__(self, *, clock=time.monotonic, concurrency: int = 10, breaker_cooldown=None):
        self._clock = clock
        self.concurrency = concurrency  # attempts running per target (invariant 7)
        self._breaker_cooldown = breaker_cooldown
        self._lock = threading.Lock()
        self._by_id: dict[int, EngineTarget] = {}
        self._overflowing: set[int] = set()  # targets with an overflow_from
        self._lanes: set[int] = set()  # targets whose lane_waiting is set
        # One check of the rows at a time: two crossing could put back the older
        # row of a target changed between their reads.
        self._refreshing = threading.RLock()
        # When the last check whose rows are in place began (set once they are:
        # an attempt that finds it recent must find those rows).
        self._checked = float("-inf")

    def new_breaker(self) -> CircuitBreaker:
        return CircuitBreaker(clock=self._clock, cooldown=self._breaker_cooldown)

    # --- rows ----------------------------------------------------------------------

    def get(self, target_id: int) -> EngineTarget | None:
        """The target; None once it was deleted (or before it was loaded). No lock:
        every attempt asks, from every worker."""
        return self._by_id.get(target_id)

    def rows(self) -> list[TargetState]:
        """Every target's row as last read."""
        return [target.row for target in list(self._by_id.values())]

    def load(self, target_ids) -> None:
        """Read the targets not known yet (one query for all of them)."""
        missing = [t for t in set(target_ids) if t not in self._by_id]
        if not missing:
            return
        rows = [TargetState(row) for row in _read(missing)]
        with self._lock:
            for row in rows:
                if row.id not in self._by_id:
                    self._by_id[row.id] = EngineTarget(row, self)

    def stale(self) -> bool:
        """Whether the rows in place come from a check begun over FRESH seconds ago."""
        return self._clock() - self._checked > self.FRESH

    def refresh(self, *, force: bool = False, if_stale: bool = False) -> list:
        """Re-read the targets whose row changed since they were read: at most every
        REFRESH seconds unless `force`d; with `if_stale`, only if no check began
        in the last FRESH seconds (another worker's meanwhile counts).

        A re-pointed target gets a fresh breaker, one whose rate limit changed a
        fresh slot; a deleted one is dropped. Returns (target, what) for what the
        engine must act on (GONE, HELD, RESUMED, REORDERED, REPOINTED).
        """
        with self._refreshing:
            if if_stale and not self.stale():
                return []
            return self._refresh(force or if_stale)

    def _refresh(self, force: bool) -> list:
        now = self._clock()
        if not force and now - self._checked < self.REFRESH:
            return []
        known = {t: target.row.updated_at for t, target in list(self._by_id.items())}
        current = {}
        ids = list(known)
        for start in range(0, len(ids), self.CHUNK):
            chunk = ids[start : start + self.CHUNK]
            current.update(Target.objects.filter(id__in=chunk).values_list("id", "updated_at"))
        moved = [t for t, version in current.items() if version != known[t]]
        fresh = {row["id"]: TargetState(row) for row in _read(moved)} if moved else {}
        found = []
        with self._lock:
            for target_id in known:
                target = self._by_id.get(target_id)
                if target is None:
                    continue
                if target_id not in current:
                    del self._by_id[target_id]
                    found.append((target, GONE))
                elif target_id in fresh:
                    found.extend((target, what) for what in self._replace(target, fresh[target_id]))
            self._checked = now
        return found

    def _replace(self, target: EngineTarget, new: TargetState) -> list:
        old, target.row = target.row, new
        if new.held != old.held:
            return [HELD if new.held else RESUMED]
        if new.held:
            return []
        found = []
        if (old.type, old.config) != (new.type, new.config):
            # Re-pointed: what the old receiver did says nothing of the new one.
            target.breaker = None
            found.append(REPOINTED)
        if old.rate_limit != new.rate_limit:
            target.next_slot = None
        if old.ordered != new.ordered:
            found.append(REORDERED)
        return found

    def set_failing_since(self, target_id: int, since) -> None:
        """The engine wrote failing_since itself (an update that leaves updated_at,
        the version, alone): keep the row in step."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None:
                row = {name: getattr(target.row, name) for name in FIELDS}
                row["failing_since"] = since
                target.row = TargetState(row)

    # --- the gate ----------------------------------------------------------------

    def discharge(self, target_id: int) -> None:
        """The engine let go of one of the target's tasks."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None and target.held > 0:
                target.held -= 1

    def held(self, target_id: int) -> int:
        target = self._by_id.get(target_id)
        return target.held if target is not None else 0

    def held_targets(self) -> list[int]:
        """The targets of which the engine holds any task."""
        with self._lock:
            return [t for t, target in self._by_id.items() if target.held > 0]

    def enter(self, task) -> bool:
        """Take an attempt slot for the task's target, or park the task and say False."""
        with self._lock:
            target = self._by_id.get(task.target_id)
            if target is None or target.running < self.concurrency:
                if target is not None:
                    target.running += 1
                return True  # a deleted target's task goes on to be released
            target.parked.append(task)
            return False

    def leave(self, target_id: int):
        """Give the slot to the target's next parked task (returned), or free it."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None:
                return None
            if target.parked:
                return target.parked.popleft()
            target.running = max(0, target.running - 1)
            return None

    def vacate(self, target_id: int):
        """Free the slot, and unpark the target's next task (returned) to enter
        again: no task holds a slot outside the worker that attempts it."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None:
                return None
            target.running = max(0, target.running - 1)
            return target.parked.popleft() if target.parked else None

    def drain_parked(self) -> list:
        """Take every parked task out (shutdown, the partitions lost)."""
        with self._lock:
            parked = []
            for target in self._by_id.values():
                parked.extend(target.parked)
                target.parked.clear()
            return parked

    def forget_where(self, which) -> list:
        """`forget()` each target `which(target_id)` accepts (partitions another
        engine may own now); return their parked tasks."""
        parked = []
        for target in [t for t in list(self._by_id.values()) if which(t.id)]:
            parked.extend(target.forget())
        return parked

    # --- overflow ----------------------------------------------------------------

    def note_overflow(self, target_id: int, delivery_id: int) -> None:
        """A delivery of the target was left in the database: it was full."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None:
                return  # deleted, or never loaded: nothing of it to read back
            if target.overflow_from is None or delivery_id < target.overflow_from:
                target.overflow_from = delivery_id
                self._overflowing.add(target_id)

    def overflowed(self) -> list[tuple[int, int]]:
        """(target id, lowest delivery id left) of the targets that overflowed."""
        with self._lock:
            found = ((t, self._by_id.get(t)) for t in self._overflowing)
            return [(t, target.overflow_from) for t, target in found if target is not None]

    def overflowing(self, target_id: int) -> bool:
        return target_id in self._overflowing

    def advance_overflow(self, target_id: int, used_from: int, last_id: int | None) -> None:
        """The drain read from `used_from` up to `last_id` (None: nothing was left).
        A lower id noted meanwhile by another claimant wins over the advance."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None or target.overflow_from is None:
                self._overflowing.discard(target_id)
                return
            if target.overflow_from < used_from:
                return
            if last_id is None:
                target.overflow_from = None
                self._overflowing.discard(target_id)
            else:
                target.overflow_from = last_id + 1

    # --- ordered lanes -------------------------------------------------------------

    def note_lane(self, target_id: int) -> None:
        """The ordered target may have unfinished deliveries: read its head when free."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None:
                target.lane_waiting = True
                self._lanes.add(target_id)

    def rest_lane(self, target_id: int) -> None:
        """Nothing of the lane to read now: no unfinished delivery, or the target is
        held or not ordered (noted again when that changes)."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None:
                target.lane_waiting = False
            self._lanes.discard(target_id)

    def waiting_lanes(self) -> list[int]:
        """The lanes whose next head is to be read, with none in flight or being read."""
        with self._lock:
            found = ((t, self._by_id.get(t)) for t in self._lanes)
            return [
                t
                for t, target in found
                if target is not None and target.head is None and not target.reading
            ]

    def begin_head(self, target_id: int) -> bool:
        """Read the target's next head, if nobody has one in flight or is reading
        it (then True: start_head() or end_head() follows)."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None or target.head is not None or target.reading:
                return False
            target.reading = True
            return True

    def start_head(self, target_id: int, delivery_id: int) -> None:
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None:
                target.reading = False
                target.head = delivery_id

    def end_head(self, target_id: int) -> None:
        """The read claimed no head (or start_head() already ran)."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is not None:
                target.reading = False

    def head_done(self, target_id: int, delivery_id: int) -> bool:
        """A task let go; True if it was its target's head (the next may go)."""
        with self._lock:
            target = self._by_id.get(target_id)
            if target is None or target.head != delivery_id:
                return False
            target.head = None
            target.lane_waiting = True
            self._lanes.add(target_id)
            return True

    # --- breakers ------------------------------------------------------------------

    def not_closed(self) -> dict[int, CircuitBreaker]:
        """The breakers that are open or half-open, by target id."""
        found = {}
        for target in list(self._by_id.values()):
            breaker = target.breaker  # read once: forget() may drop it meanwhile
            if breaker is not None and breaker.is_open:
                found[target.id] = breaker
        return found

    def breaker_states(self) -> dict:
        """Every breaker that is not closed, as the heartbeat row publishes them."""
        now, wall = self._clock(), timezone.now()

        def at(clock_time):
            return (wall + datetime.timedelta(seconds=clock_time - now)).isoformat()

        return {
            str(target_id): {
                "state": breaker.state,
                "since": at(breaker.open_since) if breaker.open_since is not None else None,
                "until": at(breaker.opened_until),
            }
            for target_id, breaker in self.not_closed().items()
        }


def _read(ids) -> list[dict]:
    return list(Target.objects.filter(id__in=ids).values(*FIELDS))
