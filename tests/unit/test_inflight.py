import threading

from deliveries.engine.inflight import InflightSet


def test_a_new_set_is_ready_and_empty():
    s = InflightSet()
    assert s.held() == 0
    assert s.retain_idle(1)


def test_retain_idle_claims_once():
    s = InflightSet()
    assert s.retain_idle(7)
    assert not s.retain_idle(7)
    assert s.owns(7)
    s.release(7)
    assert not s.owns(7)
    assert s.retain_idle(7)


def test_references_are_counted():
    s = InflightSet()
    s.retain_idle(3)
    s.retain(3)  # e.g. a scheduled retry while the worker still holds its own
    s.release(3)
    assert s.owns(3)
    assert not s.retain_idle(3)
    s.release(3)
    assert not s.owns(3)
    assert s.held() == 0


def test_held_counts_deliveries_not_references():
    s = InflightSet()
    s.retain_idle(1)
    s.retain(1)
    s.retain_idle(2)
    assert s.held() == 2
    for delivery_id in (1, 1, 2):
        s.release(delivery_id)
    assert s.held() == 0


def test_racing_retain_idle_has_exactly_one_winner():
    s = InflightSet()
    rounds, threads = 300, 8
    wins = [[0] * threads for _ in range(rounds)]
    barrier = threading.Barrier(threads)

    def contend(n):
        for r in range(rounds):
            barrier.wait()
            if s.retain_idle(r):
                wins[r][n] = 1

    workers = [threading.Thread(target=contend, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(sum(row) == 1 for row in wins)
    for r in range(rounds):
        s.release(r)
    assert s.held() == 0
