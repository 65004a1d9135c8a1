import gc

import pytest

from webhooker.runtime import THRESHOLDS, tune_garbage_collector


@pytest.fixture
def collector_restored():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_a_loaded_process_leaves_what_it_holds_out_of_later_collections(collector_restored):
    """What is alive once the process has loaded is frozen (no generation holds it,
    so no collection walks it), what comes after is collected as usual, and young
    collections come after THRESHOLDS[0] allocations, not 700."""
    loaded = {"a": []}
    tune_garbage_collector()
    later = {"b": []}
    tracked = {id(obj) for obj in gc.get_objects()}
    assert id(loaded) not in tracked
    assert id(later) in tracked
    assert gc.get_threshold() == THRESHOLDS
