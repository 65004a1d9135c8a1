"""The SSRF guard inside the HTTP transport (see deliveries/ssrf.py).

urllib3 normally resolves a host and connects to whatever comes back. These
connection classes resolve once, refuse the connection if any address is refused,
and connect to the vetted address itself, so no second resolution happens between
check and connect: a DNS answer that changes (rebinding) meets the same check.
"""

import contextvars
import socket

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.poolmanager import PoolManager
from urllib3.util import connection
from urllib3.util.url import _encode_target

from deliveries import ssrf
from deliveries.targets.deadline import watchdog
from deliveries.targets.errors import causes


class _Guarded:
    def request(self, *args, **kwargs):
        watchdog.bind(self.sock)  # a kept-alive connection's socket
        return super().request(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        sock = self._connect_vetted()
        watchdog.bind(sock)
        return sock

    def _connect_vetted(self) -> socket.socket:
        try:
            addresses = ssrf.resolve(self._dns_host, self.port)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        for address in addresses:
            reason = ssrf.refusal(address)
            if reason:
                blocked = ssrf.BlockedAddress(f"{self.host} resolves to {reason}")
                raise NewConnectionError(self, f"refused: {blocked}") from blocked
        error = None
        for address in addresses:
            try:
                return connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                error = ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out (timeout={self.timeout})"
                )
                error.__cause__ = exc
            except OSError as exc:
                error = NewConnectionError(self, f"Failed to establish a connection: {exc}")
                error.__cause__ = exc
        raise error or NewConnectionError(self, f"{self.host} has no address")


class GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


# The request target exactly as the transport built it (transport.post). urllib3's
# urlopen rewrites every percent-escape of a target in capitals (_encode_target);
# a receiver that signs or compares the URL it was sent would see "%c3" become
# "%C3". Sent as built when that rewriting is all that differs.
exact_target: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "exact_target", default=None
)


class _ExactTarget:
    def _make_request(self, conn, method, url, *args, **kwargs):
        exact = exact_target.get()
        if exact is not None and exact != url and _encode_target(exact) == url:
            url = exact
        return super()._make_request(conn, method, url, *args, **kwargs)


class GuardedHTTPConnectionPool(_ExactTarget, HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(_ExactTarget, HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


def guarded_pools(**kwargs) -> PoolManager:
    """A PoolManager (`kwargs` as urllib3 takes them) whose pools connect only
    through the guard."""
    manager = PoolManager(**kwargs)
    manager.pool_classes_by_scheme = {
        "http": GuardedHTTPConnectionPool,
        "https": GuardedHTTPSConnectionPool,
    }
    return manager


def blocked_reason(exc: BaseException) -> str | None:
    """The guard's refusal behind an exception of the transport, if that is what
    it was."""
    for cause in causes(exc):
        if isinstance(cause, ssrf.BlockedAddress):
            return str(cause)
    return None
