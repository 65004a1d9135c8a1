"""Open-loop load: sends at their scheduled times, whatever the answers take, so a
slow answer cannot hide the queueing it causes (latency counts from the schedule)."""

import threading
import time


def open_loop(rate, seconds, *, threads, lead, sender):
    """`rate` sends a second for `seconds`, on `threads` threads, the first `lead`
    seconds from now. `sender()` makes one thread's sender: called with each send's
    scheduled time (time.monotonic()) once it comes, it sends and returns the
    result; its `close()` runs when the schedule is done. Returns every result."""
    total = max(1, int(rate * seconds))
    start = time.monotonic() + lead
    lock = threading.Lock()
    counter = iter(range(total))
    results = []

    def run():
        send = sender()
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    break
                due = start + i / rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                result = send(due)
                with lock:
                    results.append(result)
        finally:
            send.close()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results
