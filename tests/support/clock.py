"""A clock the test moves by hand (`clock.now += 2.5`), for whatever takes one."""


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now
