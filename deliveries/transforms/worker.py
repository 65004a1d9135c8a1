"""One transform worker process: reads calls on stdin, answers on stdout.

Run as `python -I worker.py <megabytes>` by pool.Pool, never imported by the engine,
with an empty environment (jq's `$ENV` must not read the engine's secrets). It
imports nothing of Django. A call is two lines: the program as a JSON string, then
the input document as JSON text, which jq parses itself (its `body` is filled in
here from its `text`, by jq's `fromjson`). The answer is one line, built without
parsing jq's output again: `["ok", [value, ...]]` (at most two values: a third is
never computed), `["shown", [input, [value, ...]]]` for a program sent with the
SHOW prefix, `["error", "<jq's message>"]` or `["memory", ""]`.

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
# A program prefixed with this (never valid jq) also answers with its input.
SHOW = "#show\n"
# The program inside parentheses: no `import` or `include` (a syntax error there), a
# trailing comment closed by the newline, and no more than two values computed.
BODY = ".body = (.text | try fromjson catch null) | "
RUN = BODY + "[limit(2; ({}\n))]"
RUN_SHOWN = BODY + "[., [limit(2; ({}\n))]]"


def wrapped(program: str) -> str:
    """The jq program a worker runs for a transform `program` (validation compiles
    it too, so what saves is what runs)."""
    if program.startswith(SHOW):
        return RUN_SHOWN.format(program.removeprefix(SHOW))
    return RUN.format(program)


def main(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Die with the parent even in the middle of a runaway program (stdin's end is
    # read only between calls).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    import jq  # after the limit: its allocations count

    compiled: dict[str, object] = {}
    lines = sys.stdin.buffer
    out = sys.stdout.buffer
    while True:
        program_line, document = lines.readline(), lines.readline()
        if not document:
            return
        kind = "ok"
        try:
            program = json.loads(program_line)
            runnable = compiled.get(program)
            if runnable is None:
                if len(compiled) >= CACHE_SIZE:
                    compiled.pop(next(iter(compiled)))
                runnable = compiled[program] = jq.compile(wrapped(program))
            if program.startswith(SHOW):
                kind = "shown"
            values = runnable.input_text(document.decode()).text()
            answer = f'["{kind}", {values}]\n'.encode()
        except MemoryError:
            answer = b'["memory", ""]\n'
        except Exception as exc:  # jq's errors are ValueError
            answer = json.dumps(["error", str(exc)]).encode() + b"\n"
        out.write(answer)
        out.flush()
        if answer.startswith(b'["memory"'):
            return  # what is left of this process's heap is not to be trusted


if __name__ == "__main__":
    main(int(sys.argv[1]))
