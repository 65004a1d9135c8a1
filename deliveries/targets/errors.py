"""What went wrong with an attempt, in words an operator reads at a glance.

The first line is short ("connection refused", "TLS: certificate verify failed:
self-signed certificate", "timed out after 10 s"); the library's own text follows
on the next line, for whoever needs the detail.
"""

import http.client
import socket
import ssl

from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout


def causes(exc: BaseException) -> list[BaseException]:
    """The exception and every exception behind it (causes, contexts, wrapped
    reasons and arguments), outermost first, each once."""
    seen, found, stack = set(), [], [exc]
    while stack:
        current = stack.pop(0)
        # Only exceptions: ssl.SSLError.reason, say, is a string.
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        stack.extend(getattr(current, "args", ()))
    return found


def describe(exc: BaseException, timeout: float) -> str:
    """A short human message, then the detail on the next line."""
    return f"{summary(exc, timeout)}\n{type(exc).__name__}: {exc}"[:2000]


def summary(exc: BaseException, timeout: float) -> str:
    chain = causes(exc)
    for cause in chain:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS: certificate verify failed: {cause.verify_message or cause.reason}"
    for cause in chain:
        if isinstance(cause, ssl.SSLError):
            reason = (cause.reason or str(cause)).replace("_", " ").lower()
            if "wrong version number" in reason or "record layer failure" in reason:
                return "TLS: the receiver does not speak TLS on this port (plain HTTP?)"
            return f"TLS: {reason}"
    for cause in chain:
        if isinstance(cause, NameResolutionError | socket.gaierror):
            return "DNS name not found"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        # A ConnectionResetError too, but a different story: the connection was
        # taken and the request sent, and no status line ever came back.
        if isinstance(cause, http.client.RemoteDisconnected):
            return "the receiver closed the connection without answering"
        if isinstance(cause, ConnectionResetError):
            return "connection reset by the receiver"
    # Before the timeouts: urllib3's NewConnectionError is one of them by class.
    if isinstance(exc, NewConnectionError | ProtocolError | ConnectionError):
        return "connection failed"
    if connect_timed_out(exc):
        return f"could not connect within {timeout:g} s"
    if isinstance(exc, Urllib3Timeout | TimeoutError):
        return f"timed out after {timeout:g} s"
    return f"{type(exc).__name__}"


def connect_timed_out(exc: BaseException) -> bool:
    """Whether `exc` is a connect that took too long (urllib3's NewConnectionError
    is a ConnectTimeoutError too, though it means the connection failed)."""
    return isinstance(exc, ConnectTimeoutError) and not isinstance(exc, NewConnectionError)
