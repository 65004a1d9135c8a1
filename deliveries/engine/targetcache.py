"""The engine's view of its targets, kept current without a query per attempt.

Every attempt uses the target as it is in the database (a URL changed, a target
paused, deactivated or deleted takes effect on the next attempt, not after the
delivery ends). Tasks carry no copy of the target: they look it up here at
attempt time. The cache re-reads a target whose `updated_at` moved, checking
every target it knows in one query at most every REFRESH seconds (and when woken,
as after a pause or resume), and before an attempt whenever its last check began
more than FRESH seconds ago (`stale()`): a change committed FRESH seconds ago is in
every attempt begun since, which is what a secret rotation's answer waits for
(Target.until_engines_see_changes).
"""

from __future__ import annotations

import threading
import time

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

    __slots__ = FIELDS

    def __init__(self, row: dict):
        for name in FIELDS:
            object.__setattr__(self, name, row[name])

    def __setattr__(self, name, value):
        raise AttributeError("a TargetState is replaced, not changed")

    def __repr__(self):
        return f"<TargetState {self.id} {self.type} v{self.updated_at:%H:%M:%S.%f}>"

    @property
    def unreadable(self) -> str:
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


class TargetCache:
    REFRESH = 0.5
    FRESH = Target.ENGINE_FRESHNESS
    # Target ids per query when checking versions.
    CHUNK = 1000

    def __init__(self, *, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[int, TargetState] = {}
        # When the last check whose rows are in place began (set once they are:
        # an attempt that finds it recent must find those rows).
        self._checked = float("-inf")

    def get(self, target_id: int) -> TargetState | None:
        """The target as last read; None once it was deleted (or never loaded).
        No lock: a dict lookup is atomic, and writers replace whole states (under
        the lock, against each other). Every attempt asks, from every worker."""
        return self._states.get(target_id)

    def states(self) -> list[TargetState]:
        """Every target as last read."""
        return list(self._states.values())

    def load(self, target_ids) -> None:
        """Read the targets not known yet (one query for all of them)."""
        with self._lock:
            missing = [t for t in set(target_ids) if t not in self._states]
        if not missing:
            return
        states = {row["id"]: TargetState(row) for row in _read(missing)}
        with self._lock:
            for target_id, state in states.items():
                self._states.setdefault(target_id, state)

    def refresh(self, *, force: bool = False) -> tuple[list, list]:
        """Re-read the targets whose row changed since they were read.

        Returns (changed, deleted): a list of (old, new) states and a list of
        (old state) of targets that no longer exist. At most every REFRESH seconds
        unless forced. The engine runs one at a time (Engine.refresh_targets).
        """
        now = self._clock()
        if not force and now - self._checked < self.REFRESH:
            return [], []
        with self._lock:
            known = {t: s.updated_at for t, s in self._states.items()}
        if not known:
            self._checked = now
            return [], []
        ids = list(known)
        current = {}
        for start in range(0, len(ids), self.CHUNK):
            chunk = ids[start : start + self.CHUNK]
            current.update(Target.objects.filter(id__in=chunk).values_list("id", "updated_at"))
        stale = [t for t, version in current.items() if version != known[t]]
        fresh = {row["id"]: TargetState(row) for row in _read(stale)} if stale else {}
        changed, deleted = [], []
        with self._lock:
            for target_id in known:
                old = self._states.get(target_id)
                if target_id not in current:
                    deleted.append(self._states.pop(target_id))
                elif target_id in fresh and old is not None:
                    self._states[target_id] = fresh[target_id]
                    changed.append((old, fresh[target_id]))
            self._checked = now
        return changed, deleted

    def stale(self) -> bool:
        """Whether the rows in place come from a check begun over FRESH seconds ago."""
        return self._clock() - self._checked > self.FRESH

    def set_failing_since(self, target_id: int, since) -> None:
        """The engine wrote failing_since itself (an update that leaves updated_at,
        the version, alone): keep the cached row in step."""
        with self._lock:
            state = self._states.get(target_id)
            if state is not None:
                row = {name: getattr(state, name) for name in FIELDS}
                row["failing_since"] = since
                self._states[target_id] = TargetState(row)


def _read(ids) -> list[dict]:
    return list(Target.objects.filter(id__in=ids).values(*FIELDS))
