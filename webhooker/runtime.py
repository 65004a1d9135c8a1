"""How the delivery engine (rundelivery) sets up the interpreter once it has
loaded.

CPython's cyclic garbage collector runs a young collection every 700 net
allocations of container objects and now and then walks every object the process
holds. A loaded Django process holds a few hundred thousand objects that live as
long as it does (modules, models, URL patterns); an engine with thousands of
attempts in flight allocates a great many short-lived ones (coroutines, futures,
header dicts). Each full collection walked all of them, and profiles of the engine
showed the collector's traversal among its heaviest costs (bench/RESULTS.md).
"""

import gc

# Young collections after this many net allocations of container objects
# (CPython's default: 700), the older generations after 20 collections of the one
# below. An engine makes next to no garbage in cycles: with the collector off,
# 10 000 deliveries left some 400 objects for it (the threads' own at exit), and a
# failed attempt lets go of its exception's frames (targets/errors.let_go). So a
# young collection walks live objects, the attempts in flight, and the fewer
# collections the fewer walks; what garbage in cycles there is waits for at most
# this many allocations, tens of megabytes were every one of them garbage.
THRESHOLDS = (300_000, 20, 20)


def tune_garbage_collector() -> None:
    """Collect once, then freeze what is alive (loaded code and configuration,
    which live as long as the process) out of every later collection, and collect
    the young generation less often. Call it once the process has loaded, before
    its work begins."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
