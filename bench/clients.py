"""The spike behind the engine's HTTP client (issue 26): the same POSTs sent by
each candidate design against the same receivers (bench/slowsink.py, a process of
its own), each candidate in a fresh process so its memory is its own.

    python bench/clients.py [REQUESTS] [IN_FLIGHT]

Prints, per candidate: requests/s, CPU per request (user + system of the sending
process) and peak RSS, and each candidate's CPU per request against one bare
urllib3 POST to the instant receiver measured in the same run (the ratio is what
travels between machines). bench/RESULTS.md keeps the findings.
"""

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

BODY = json.dumps({"event": "spike", "data": "x" * 512}).encode()
HEADERS = {"Content-Type": "application/json", "X-Webhooker-Event": "spike"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_sink(delay: float):
    port = free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen(
        [sys.executable, os.path.join(here, "slowsink.py"), str(port), str(delay)]
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the sink did not start")


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def urls(port, n):
    # 200 targets: distinct paths on one receiver.
    return [f"http://127.0.0.1:{port}/t/{i % 200}" for i in range(n)]


# --- candidates (each runs in a child process: `python clients.py --run NAME ...`) ---


def run_urllib3_serial(port, n, _inflight):
    import urllib3

    pool = urllib3.PoolManager(maxsize=1)
    for url in urls(port, n):
        pool.request("POST", url, body=BODY, headers=HEADERS).data  # noqa: B018


def run_urllib3_threads(port, n, inflight):
    import urllib3

    work = iter(urls(port, n))
    lock = threading.Lock()

    def worker():
        pool = urllib3.PoolManager(maxsize=1)
        while True:
            with lock:
                url = next(work, None)
            if url is None:
                return
            pool.request("POST", url, body=BODY, headers=HEADERS).data  # noqa: B018

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=worker) for _ in range(inflight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_aiohttp(port, n, inflight):
    import aiohttp

    async def main():
        connector = aiohttp.TCPConnector(limit=0, use_dns_cache=False)
        async with aiohttp.ClientSession(
            connector=connector, skip_auto_headers=("User-Agent",)
        ) as session:
            gate = asyncio.Semaphore(inflight)

            async def one(url):
                async with gate, session.post(url, data=BODY, headers=HEADERS) as response:
                    await response.content.read(4096)

            await asyncio.gather(*(one(url) for url in urls(port, n)))

    asyncio.run(main())


def run_httpx(port, n, inflight):
    import httpx

    async def main():
        limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
        async with httpx.AsyncClient(limits=limits) as client:
            gate = asyncio.Semaphore(inflight)

            async def one(url):
                async with gate:
                    response = await client.post(url, content=BODY, headers=HEADERS)
                    response.read()

            await asyncio.gather(*(one(url) for url in urls(port, n)))

    asyncio.run(main())


CANDIDATES = {
    "urllib3_serial": run_urllib3_serial,
    "urllib3_threads": run_urllib3_threads,
    "aiohttp": run_aiohttp,
    "httpx": run_httpx,
}


def child(name, port, n, inflight):
    start, used = time.monotonic(), cpu()
    CANDIDATES[name](port, n, inflight)
    wall, used = time.monotonic() - start, cpu() - used
    print(json.dumps({"rps": n / wall, "cpu_ms": used / n * 1000, "rss_mb": peak_rss_mb()}))


def measure(name, port, n, inflight):
    out = subprocess.run(
        [sys.executable, __file__, "--run", name, str(port), str(n), str(inflight)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    inflight = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    instant, instant_port = start_sink(0.0)
    slow, slow_port = start_sink(0.5)
    try:
        bare = measure("urllib3_serial", instant_port, min(n, 3000), 1)
        print(f"bare urllib3 POST, instant receiver: {bare['cpu_ms']:.3f} ms CPU each")
        rows = [
            ("urllib3_threads", 10),
            ("urllib3_threads", inflight),
            ("aiohttp", inflight),
            ("httpx", inflight),
        ]
        for name, width in rows:
            for label, port in (("instant", instant_port), ("500 ms", slow_port)):
                got = measure(name, port, n, width)
                print(
                    f"{name:16} in flight {width:5}  {label:8} {got['rps']:8.0f}/s  "
                    f"cpu {got['cpu_ms']:.3f} ms ({got['cpu_ms'] / bare['cpu_ms']:.2f}x bare)  "
                    f"rss {got['rss_mb']:.0f} MB",
                    flush=True,
                )
    finally:
        instant.kill()
        slow.kill()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
