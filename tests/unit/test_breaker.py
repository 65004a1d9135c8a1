from deliveries.engine.backoff import backoff_delay, retry_delay
from deliveries.engine.breaker import CircuitBreaker
from tests.support.clock import FakeClock


def test_opens_after_five_consecutive_failures():
    clock = FakeClock()
    b = CircuitBreaker(clock=clock)
    for _ in range(4):
        assert b.allow() is None
        b.record(False)
    assert b.state == b.CLOSED
    b.record(False)
    assert b.state == b.OPEN
    assert b.allow() == 1030.0  # deferred to the end of the 30 s cooldown


def test_success_resets_the_count():
    b = CircuitBreaker(clock=FakeClock())
    for _ in range(4):
        b.record(False)
    b.record(True)
    for _ in range(4):
        b.record(False)
    assert b.state == b.CLOSED


def test_half_open_lets_one_probe_through_and_closes_on_success():
    clock = FakeClock()
    b = CircuitBreaker(clock=clock)
    for _ in range(5):
        b.record(False)
    clock.now += 29.9
    assert b.allow() is not None
    clock.now += 0.2
    assert b.allow() is None  # the probe
    assert b.state == b.HALF_OPEN
    assert b.allow() is not None  # others wait while the probe is out
    b.record(True)
    assert b.state == b.CLOSED
    assert b.allow() is None


def test_failed_probe_reopens_for_a_full_cooldown():
    clock = FakeClock()
    b = CircuitBreaker(clock=clock)
    for _ in range(5):
        b.record(False)
    clock.now += 30
    assert b.allow() is None
    b.record(False)
    assert b.state == b.OPEN
    assert b.allow() == clock.now + 30


def test_backoff_schedule_doubles_from_the_base_up_to_the_cap():
    no_jitter = lambda: 0.5  # noqa: E731
    delays = [backoff_delay(n, base=1, cap=3600, rand=no_jitter) for n in range(1, 15)]
    assert delays[:6] == [1, 2, 4, 8, 16, 32]
    assert delays[-1] == 3600
    assert backoff_delay(10_000, base=1, cap=3600, rand=no_jitter) == 3600


def test_backoff_jitter_is_ten_percent_either_way():
    assert backoff_delay(4, base=1, cap=3600, rand=lambda: 0.0) == 8 * 0.9
    assert backoff_delay(4, base=1, cap=3600, rand=lambda: 1.0) == 8 * 1.1
    assert backoff_delay(20, base=1, cap=3600, rand=lambda: 1.0) == 3600


def test_retry_after_is_honoured_up_to_the_cap():
    no_jitter = lambda: 0.5  # noqa: E731
    assert retry_delay(1, 120, base=1, cap=3600, rand=no_jitter) == 120
    assert retry_delay(1, 10**9, base=1, cap=3600, rand=no_jitter) == 3600
    assert retry_delay(5, 2, base=1, cap=3600, rand=no_jitter) == 16  # backoff longer
    assert retry_delay(1, None, base=1, cap=3600, rand=no_jitter) == 1
