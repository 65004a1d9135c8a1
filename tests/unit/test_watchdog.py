"""The engine's watchdog (runner.Watchdog): when it calls the engine stuck, the
partitions thread lets every partition go to the other engines."""

import threading
import time
from types import SimpleNamespace

from deliveries.engine.runner import Watchdog
from deliveries.engine.sender import Sender
from deliveries.targets import transport
from deliveries.targets.base import Outcome


class NoWorkers:
    def all_stuck(self, began_before):
        return False


def test_an_attempt_in_flight_past_every_deadline_means_the_loop_is_stuck(monkeypatch):
    """Each attempt's deadline ends it on the HTTP client's loop; an attempt in
    flight for longer than any deadline allows means the loop itself stopped, and
    with it every attempt of the engine."""
    handed_over = []
    monkeypatch.setattr(transport.client, "start", lambda req, done: handed_over.append(done))
    sender = Sender(limit=10)
    now = [time.monotonic()]
    watchdog = Watchdog(
        stall_after=30, attempt_bound=310, workers=NoWorkers(), sender=sender, clock=lambda: now[0]
    )
    assert sender.reserve(0)
    completed = []
    sender.send(SimpleNamespace(), completed.append)
    assert sender.in_flight() == 1
    now[0] += 300
    assert watchdog.healthy()
    now[0] += 20
    assert not watchdog.healthy()

    # Its outcome comes back after all: the completer runs it, and the engine moves.
    handed_over[0](Outcome(success=True))
    completer = threading.Thread(target=sender.run)
    completer.start()
    assert sender.drain(5)
    sender.stop()
    completer.join(5)
    assert completed == [Outcome(success=True)]
    assert sender.oldest() is None
    assert watchdog.healthy()
