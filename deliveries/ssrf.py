"""Which addresses a target may reach (WEBHOOKER_ALLOWED_TARGET_NETWORKS;
docs/architecture.md, Targets).

webhooker faces the internet on one side and sits inside a private network on the
other: a target URL is an attacker's way in unless every address it leads to is
checked. Refused by default: loopback, private (RFC 1918), carrier-grade NAT,
link-local (cloud metadata included), multicast, reserved, unspecified,
documentation ranges, IPv6 unique-local and link-local, and IPv6 forms that carry
an IPv4 address (mapped, 6to4, NAT64, Teredo) whose IPv4 address is refused.

The check runs twice: when a target is saved (every address the host resolves to),
and inside the HTTP transport on the address each connection is actually made to,
so a name that resolves elsewhere the second time (DNS rebinding) gains nothing.
"""

import contextlib
import functools
import ipaddress
import socket
import threading
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

NAT64 = ipaddress.ip_network("64:ff9b::/96")


class BlockedAddress(OSError):
    """A connection to a refused address was not made. OSError, so that the HTTP
    client (aiohttp's connector, through targets/guard.py) treats it as the failed
    connection it is; the transport reports it as a permanent failure."""


@functools.lru_cache(maxsize=8)
def _allowed_networks(values: tuple) -> tuple:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"WEBHOOKER_ALLOWED_TARGET_NETWORKS: {value!r} is not a network (CIDR)"
            ) from None
    return tuple(networks)


def allowed_networks() -> tuple:
    return _allowed_networks(tuple(settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS))


def _embedded_ipv4(ip):
    if ip.version != 6:
        return None
    if ip.ipv4_mapped:
        return ip.ipv4_mapped
    if ip.sixtofour:
        return ip.sixtofour
    if ip.teredo:
        return ip.teredo[1]
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(address: str) -> str | None:
    """Why `address` may not be a target, or None if it may."""
    return _refusal(address, allowed_networks())


# Every attempt to a target given by its IP address asks, and every new connection
# for each address its name resolves to: the answers for the recent ones are kept.
@functools.lru_cache(maxsize=4096)
def _refusal(address: str, allowed: tuple) -> str | None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    for network in allowed:
        if ip.version == network.version and ip in network:
            return None
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        for network in allowed:
            if network.version == 4 and embedded in network:
                return None
        # The IPv4 address inside decides: that is where the packets go.
        reason = _refusal(str(embedded), allowed)
        return f"{reason} (inside {ip})" if reason else None
    if ip.is_loopback:
        return f"{ip} is a loopback address"
    if ip.is_link_local:
        return f"{ip} is a link-local address (cloud metadata lives here)"
    if ip.is_multicast:
        return f"{ip} is a multicast address"
    if ip.is_unspecified:
        return f"{ip} is the unspecified address"
    if ip.version == 4 and ip in ipaddress.ip_network("100.64.0.0/10"):
        return f"{ip} is a carrier-grade NAT address"
    if ip.is_private or (ip.version == 6 and ip.is_site_local):
        return f"{ip} is a private address"
    if ip.is_reserved or not ip.is_global:
        return f"{ip} is a reserved address"
    return None


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to. Tests replace this to simulate DNS."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


_advance = threading.local()


@contextlib.contextmanager
def resolved_in_advance(urls):
    """Resolve the hosts of `urls` now; check_url inside the block uses the answers.

    For callers that validate inside a database transaction (the admin's forms):
    the slow part, DNS, happens before the transaction holds any lock.
    """
    answers = {}
    for url in urls:
        try:
            parts = urlsplit(url.strip())
            if parts.scheme in ("http", "https") and parts.hostname:
                port = parts.port or (443 if parts.scheme == "https" else 80)
                answers[(parts.hostname, port)] = resolve(parts.hostname, port)
        except (OSError, UnicodeError, ValueError):
            continue  # check_url reports it, resolving again
    previous = getattr(_advance, "answers", None)
    _advance.answers = answers
    try:
        yield
    finally:
        _advance.answers = previous


def check_url(url: str) -> None:
    """Raise ValueError saying why `url` may not be a target (save time)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("only http:// and https:// URLs with a host can be targets")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError("the port is not a valid port number") from None
    try:
        advance = getattr(_advance, "answers", None) or {}
        addresses = advance.get((parts.hostname, port)) or resolve(parts.hostname, port)
    except (OSError, UnicodeError, ValueError):
        raise ValueError(f"the host {parts.hostname!r} does not resolve") from None
    if not addresses:
        raise ValueError(f"the host {parts.hostname!r} does not resolve")
    for address in addresses:
        reason = refusal(address)
        if reason:
            raise ValueError(
                f"{parts.hostname} resolves to {reason}; targets may not reach it "
                "unless WEBHOOKER_ALLOWED_TARGET_NETWORKS includes it"
            )
