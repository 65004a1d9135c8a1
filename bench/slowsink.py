"""The latency-bound receiver for the scale-out benchmark (bench/scaleout.py):
an HTTP/1.1 keep-alive server answering every request after a delay. asyncio, so
thousands of waiting requests cost no thread each; a process of its own, so it
takes no time from the process measuring.

    python bench/slowsink.py PORT DELAY_SECONDS
"""

import asyncio
import sys


async def handle(reader, writer, delay):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            await asyncio.sleep(delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port, delay):
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, delay), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
