"""How a long-running webhooker process sets up the interpreter once it has loaded
(the delivery engine, gunicorn's workers).

CPython's cyclic garbage collector runs a young collection every 700 net
allocations of container objects and now and then walks every object the process
holds. A loaded Django process holds a few hundred thousand objects that live as
long as it does (modules, models, URL patterns); an engine with thousands of
attempts in flight allocates a great many short-lived ones (coroutines, futures,
header dicts). Each full collection walked all of them, and profiles of the engine
showed the collector's traversal among its heaviest costs (bench/RESULTS.md).
"""

import gc

# Young collections after this many net allocations (CPython's default: 700); the
# older generations at their defaults' spirit, every 20 collections of the one
# below. Garbage in cycles waits a little longer to be freed: a few megabytes.
THRESHOLDS = (10_000, 20, 20)


def tune_garbage_collector() -> None:
    """Collect once, then freeze what is alive (loaded code and configuration,
    which live as long as the process) out of every later collection, and collect
    the young generation less often. Call it once the process has loaded, before
    its work begins."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
