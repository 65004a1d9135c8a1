"""How many attempts an engine keeps in flight under its open-files limit
(rundelivery.allow_open_files); the limit itself is the kernel's, faked here. A real
engine under `ulimit` is in tests/e2e/test_e2e.py."""

import logging
import resource

import pytest
from django.core.management import call_command

from deliveries.management.commands import rundelivery


@pytest.fixture
def limits(monkeypatch):
    """(soft, hard) as the process would see them; setrlimit moves the soft one."""
    state = {}

    def set_limit(kind, value):
        assert kind == resource.RLIMIT_NOFILE and value[1] == state["hard"]
        assert value[0] <= state["hard"] or state["hard"] == resource.RLIM_INFINITY
        state["soft"] = value[0]

    monkeypatch.setattr(
        rundelivery.resource, "getrlimit", lambda kind: (state["soft"], state["hard"])
    )
    monkeypatch.setattr(rundelivery.resource, "setrlimit", set_limit)
    return state


@pytest.mark.parametrize(
    ("soft", "hard", "inflight", "fits", "soft_after"),
    [
        (1024, 65536, 5000, 5000, 6024),  # raised as far as needed
        (1024, resource.RLIM_INFINITY, 5000, 5000, 6024),
        (100_000, 100_000, 5000, 5000, 100_000),  # enough already: left alone
        (1024, 4096, 5000, 3072, 4096),  # short: what fits beside the other files
        (1024, 1536, 5000, 768, 1536),  # at least half the limit
        (1024, 1030, 10, 10, 1030),  # short of the reserve, yet room for all ten
    ],
)
def test_attempts_in_flight_fit_the_open_files_limit(
    limits, caplog, soft, hard, inflight, fits, soft_after
):
    limits.update(soft=soft, hard=hard)
    assert rundelivery.allow_open_files(inflight) == fits
    assert limits["soft"] == soft_after
    warned = [r for r in caplog.records if "open files are limited" in r.getMessage()]
    assert len(warned) == (fits < inflight)


def test_the_engine_is_built_with_the_attempts_that_fit(limits, settings, monkeypatch):
    """rundelivery hands what fits to the engine, not DELIVERY_INFLIGHT."""
    built = []
    monkeypatch.setattr(rundelivery, "tune_garbage_collector", lambda: None)
    for run in ("_run_alone", "_run_partitioned"):
        monkeypatch.setattr(
            rundelivery.Command, run, lambda self, config, options: built.append(config)
        )
    limits.update(soft=1024, hard=1536)
    settings.DELIVERY_INFLIGHT = 5000
    level = logging.getLogger("deliveries").level
    try:
        call_command("rundelivery", verbosity=0)
    finally:
        logging.getLogger("deliveries").setLevel(level)
    assert [config.inflight for config in built] == [768]
