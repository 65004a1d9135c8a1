"""What taking, handing over and losing partitions does to the engine's work in
memory. `partition_manager.PartitionManager` decides when (the locks, the epochs, the
lease); this module does it, and is the one writer of the engine's `Partitions`.

* take: the partitions become claimable under their new epochs, then the at-start
  recovery runs over them (every pending and retrying delivery there).
* drain: claim nothing more there, let go of their waiting tasks; a partition is
  drained once nothing of it is held (every running attempt's result committed),
  and only then unlocked: a planned hand-over sends nothing twice.
* drop: the lock connection is gone; every partition at once. Only results not
  written yet stay, each written under its own epoch (drop_all).
"""

from deliveries.engine.partitions import in_partitions
from deliveries.models import Delivery


class Handover:
    def __init__(self, engine):
        self.engine = engine
        self.partitions = engine.partitions

    def take(self, epochs: dict[int, int | None]) -> int:
        """Partitions just locked ({partition: epoch}): claim in them, starting with
        the at-start recovery pass over them. Return tasks dispatched."""
        engine, taken = self.engine, frozenset(epochs)
        # Claimable before the recovery reads: a row the cursor skipped while the
        # partition was another's is committed before this read, so it is found.
        self.partitions.take(taken, {p: e for p, e in epochs.items() if e is not None})
        count = self.partitions.count
        dispatched = engine.recover_in(lambda rows: in_partitions(rows, taken, count))
        if engine.channel.room() <= 0:
            # Pending rows past the channel's room: the cursor went by them long ago,
            # so their targets are drained from their oldest row, as overflow is.
            backlog = in_partitions(
                Delivery.objects.filter(status=Delivery.Status.PENDING), taken, count
            )
            targets = list(backlog.order_by().values_list("target_id", flat=True).distinct())
            engine.targets.load(targets)
            for target_id in targets:
                engine.targets.note_overflow(target_id, 0)
            engine.wake_event.set()
        return dispatched

    def start_drain(self, partitions) -> None:
        """Hand these partitions over: claim nothing more in them, and let go of their
        waiting tasks; running attempts finish."""
        self.partitions.start_drain(partitions)
        self.drained(partitions)

    def drained(self, partitions) -> list:
        """Let go of what the engine holds of these partitions and is not running;
        return those of which nothing is held any more (every result committed):
        they may be unlocked."""
        engine = self.engine
        count, draining = self.partitions.count, frozenset(partitions)

        def ours(target_id):
            return target_id % count in draining

        # A task whose result is not written yet stays: its attempt was sent, and
        # only its result, written here, keeps the next owner from sending it again.
        waiting = engine.scheduler.take(lambda t: ours(t.target_id) and t.unwritten is None)
        waiting += engine.channel.take(lambda t: ours(t.target_id) and t.unwritten is None)
        waiting += engine.targets.forget_where(ours)
        let_go(engine, waiting)  # rows keep their status; retrying ones their time
        held = {target_id % count for target_id in engine.targets.held_targets()}
        return sorted(draining - held)

    def let_go(self, partitions) -> None:
        """Unlocked: neither claimed nor attempted in any more."""
        self.partitions.let_go(partitions)

    def drop_all(self) -> frozenset:
        """The lock connection is gone, and every partition with it: stop attempting
        in all of them at once, and drop their work from memory (another engine may
        own their rows now). Attempts already running finish. Results not written
        yet stay, as in a drain: their attempts were sent, and each is written
        under its own epoch, which the writer checks (writer.py). Still current
        (nobody took the partition yet), or taken since by this engine alone
        (Partitions.retaken), it is written and the receiver gets the event once;
        another engine's take refuses it, and that engine sends the event again,
        as it must. Return what was held."""
        engine = self.engine
        was = self.partitions.drop_all()  # first: no claim, no attempt from here on
        waiting = engine.scheduler.take(lambda t: t.unwritten is None)
        waiting += engine.channel.take(lambda t: t.unwritten is None)
        waiting += engine.targets.forget_where(lambda target_id: True)
        let_go(engine, waiting)
        return was


def let_go(engine, tasks) -> None:
    """Release waiting tasks. One holding a result not written yet (parked at its
    target's gate) goes to the scheduler instead, to write it at once: its attempt
    was sent, and only its result keeps the event from being sent again."""
    for task in tasks:
        if task.unwritten is None:
            engine.release(task)
        else:
            engine.schedule(task, engine.clock())
