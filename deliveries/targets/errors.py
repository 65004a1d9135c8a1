"""What went wrong with an attempt, in words an operator reads at a glance.

The first line is short ("connection refused", "TLS: certificate verify failed:
self-signed certificate", "timed out after 10 s"); the library's own text follows
on the next line, for whoever needs the detail.
"""

import socket
import ssl

import aiohttp


def causes(exc: BaseException) -> list[BaseException]:
    """The exception and every exception behind it (causes, contexts, wrapped
    errors and arguments), outermost first, each once."""
    seen, found, stack = set(), [], [exc]
    while stack:
        current = stack.pop(0)
        # Only exceptions: ssl.SSLError.reason, say, is a string.
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        # aiohttp's connector errors keep what they wrap here.
        stack.append(getattr(current, "os_error", None))
        stack.append(getattr(current, "certificate_error", None))
        stack.extend(getattr(current, "args", ()))
    return found


def let_go(exc: BaseException) -> None:
    """Drop the tracebacks of `exc` and of every exception behind it, once it has
    been described. They hold the frames of the request that failed, and those
    frames the exceptions again: cycles of some 80 objects per failed attempt that
    only the cyclic collector would free, an engine's receiver being down making
    one with every attempt."""
    for cause in causes(exc):
        cause.__traceback__ = None


def describe(exc: BaseException, timeout: float) -> str:
    """A short human message, then the detail on the next line."""
    return f"{summary(exc, timeout)}\n{type(exc).__name__}: {exc}"[:2000]


def summary(exc: BaseException, timeout: float) -> str:
    # aiohttp's wrappers are TLS errors by class too: the errors they wrap speak.
    chain = [cause for cause in causes(exc) if not isinstance(cause, aiohttp.ClientError)]
    wrappers = [cause for cause in causes(exc) if isinstance(cause, aiohttp.ClientError)]
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
        if isinstance(cause, socket.gaierror):
            return "DNS name not found"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset by the receiver"
    for cause in wrappers:
        if isinstance(cause, aiohttp.ClientConnectorDNSError):
            return "DNS name not found"
        # The connection was taken and the request sent, and no status line ever
        # came back.
        if isinstance(cause, aiohttp.ServerDisconnectedError):
            return "the receiver closed the connection without answering"
        if isinstance(cause, aiohttp.ClientConnectionResetError):
            return "connection reset by the receiver"
    if connect_timed_out(exc):
        return f"could not connect within {timeout:g} s"
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return "the receiver's answer was not valid HTTP"
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError):
        return "connection failed"
    return f"{type(exc).__name__}"


def failure_class(exc: BaseException) -> str:
    """The class (base.FAILURES) of an attempt that failed with `exc`: by the same
    reading as summary()."""
    said = summary(exc, 0)
    if said.startswith("TLS"):
        return "tls"
    if said.startswith("DNS"):
        return "dns"
    if said.startswith(("could not connect", "timed out")):
        return "timeout"
    if said.startswith("the receiver's answer"):
        return "answer"
    if isinstance(exc, aiohttp.ClientError | OSError) or said.startswith(
        ("connection", "the receiver")
    ):
        return "connection"
    return "internal"


def connect_timed_out(exc: BaseException) -> bool:
    """Whether `exc` is a connect that took too long."""
    return isinstance(exc, aiohttp.ConnectionTimeoutError)
