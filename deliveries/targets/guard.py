"""The SSRF guard inside the HTTP client (see deliveries/ssrf.py).

aiohttp resolves a host through its connector's resolver and connects to the
addresses that come back. This resolver resolves once per new connection (the
connector keeps no DNS cache), refuses the connection if any address is refused,
and hands aiohttp only the vetted addresses, so no second resolution happens
between check and connect: a DNS answer that changes (rebinding) meets the same
check. aiohttp asks no resolver for a host that is an IP address: `refused_literal`
checks those before the request starts.
"""

import asyncio
import concurrent.futures
import functools
import ipaddress
import socket

from aiohttp.abc import AbstractResolver

from deliveries import ssrf
from deliveries.targets.errors import causes


class GuardedResolver(AbstractResolver):
    # Lookups at once. getaddrinfo cannot be cancelled: a lookup whose attempt timed
    # out holds its thread until the system resolver gives up (seconds per
    # nameserver). asyncio's default pool (cores + 4 threads) would let one target
    # whose nameserver is silent, at its 10 connections at once, stall every other
    # target's new connections; this pool's threads start only when needed.
    LOOKUPS = 128

    def __init__(self):
        self._lookups = concurrent.futures.ThreadPoolExecutor(
            self.LOOKUPS, thread_name_prefix="dns"
        )

    async def resolve(self, host: str, port: int = 0, family=socket.AF_INET):
        # ssrf.resolve is getaddrinfo (or a test's stand-in): blocking, so off the loop.
        loop = asyncio.get_running_loop()
        addresses = await loop.run_in_executor(self._lookups, ssrf.resolve, host, port)
        for address in addresses:
            reason = ssrf.refusal(address)
            if reason:
                raise ssrf.BlockedAddress(f"{host} resolves to {reason}")
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in addresses
        ]

    async def close(self) -> None:
        self._lookups.shutdown(wait=False, cancel_futures=True)


def refused_literal(host: str) -> str | None:
    """Why a host given as an IP address may not be connected to, or None (also
    for a host that is a name: the resolver checks those)."""
    if not is_literal(host):
        return None
    reason = ssrf.refusal(host)
    return f"{host} resolves to {reason}" if reason else None


@functools.lru_cache(maxsize=1024)
def is_literal(host: str) -> bool:
    """Whether `host` is an IP address (asked for every attempt: the recent
    answers are kept)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def blocked_reason(exc: BaseException) -> str | None:
    """The guard's refusal behind an exception of the client, if that is what it
    was."""
    for cause in causes(exc):
        if isinstance(cause, ssrf.BlockedAddress):
            return str(cause)
    return None
