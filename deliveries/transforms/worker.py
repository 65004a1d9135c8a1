"""One transform worker process: reads calls on stdin, answers on stdout.

Run as `python -m deliveries.transforms.worker <megabytes>` by pool.Pool, never
imported by the engine. It imports nothing of Django: a call is one JSON line
`[program, input]`, the answer one JSON line `["ok", [value, ...]]` (at most two
values: a third is never computed) or `["error", "<jq's message>"]`.

The limits are the parent's and the kernel's: the parent kills a call that runs past
its time, and the address space is capped here (RLIMIT_AS), so a program that builds
a huge value fails its call (libjq aborts the process, or Python raises
MemoryError) instead of taking the machine's memory.
"""

import contextlib
import ctypes
import json
import resource
import signal
import sys

# Compiled programs kept per worker: a target's program is compiled once, not per call.
CACHE_SIZE = 64
PR_SET_PDEATHSIG = 1


def main(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Die with the parent even in the middle of a runaway program (stdin's end is
    # read only between calls).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    import jq  # after the limit: its allocations count

    compiled: dict[str, object] = {}
    for line in sys.stdin.buffer:
        try:
            program, value = json.loads(line)
            runnable = compiled.get(program)
            if runnable is None:
                if len(compiled) >= CACHE_SIZE:
                    compiled.pop(next(iter(compiled)))
                runnable = compiled[program] = jq.compile(program)
            values = []
            for produced in runnable.input_value(value):
                values.append(produced)
                if len(values) == 2:
                    break
            answer = ["ok", values]
        except MemoryError:
            answer = ["memory", ""]
        except Exception as exc:  # jq's runtime errors are ValueError
            answer = ["error", str(exc)]
        try:
            out = json.dumps(answer).encode() + b"\n"
        except MemoryError:
            out = b'["memory", ""]\n'
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
        if answer[0] == "memory":
            return  # what is left of this process's heap is not to be trusted


if __name__ == "__main__":
    main(int(sys.argv[1]))
