"""Outbound HTTP for the http and slack targets: one requests.Session per thread.

A Session keeps connections alive between attempts to the same host; it is not
safe to share between threads, so each worker thread builds its own on first use.
"""

import email.utils
import threading
import time

import requests
from django.conf import settings
from urllib3 import HTTPHeaderDict
from urllib3.util import SKIP_HEADER

from deliveries.targets.base import RESPONSE_BODY_LIMIT, RESPONSE_HEADERS_LIMIT, Outcome
from deliveries.targets.deadline import watchdog
from deliveries.targets.errors import describe
from deliveries.targets.guard import GuardedAdapter, blocked_reason

_local = threading.local()

USER_AGENT = "webhooker/0.1"


def session() -> requests.Session:
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        # The receiver's proxies and .netrc of the machine must not leak into
        # deliveries: targets are exactly the configured URLs.
        s.trust_env = False
        # No headers of the client's own (Accept, Accept-Encoding, Connection,
        # User-Agent): a delivery carries what the sender sent (post()).
        s.headers.clear()
        adapter = GuardedAdapter()
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        _local.session = s
    return s


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def exact_headers(prepared: requests.PreparedRequest, headers, user_agent) -> HTTPHeaderDict:
    """The prepared request's own headers (Content-Length) and `headers`, every
    line of them, and nothing the HTTP libraries would add by default."""
    exact = HTTPHeaderDict(
        {k: v for k, v in prepared.headers.items() if k.lower() not in _lower(headers)}
    )
    for name, value in headers.items():
        exact.add(name, value)
    if "User-Agent" not in exact:
        exact["User-Agent"] = user_agent or SKIP_HEADER
    if "Accept-Encoding" not in exact:
        exact["Accept-Encoding"] = SKIP_HEADER
    return exact


def _lower(headers) -> set:
    return {name.lower() for name in headers}


def post(
    url: str, *, data: bytes, headers, timeout: float | None, forwarded: bool = False
) -> Outcome:
    """POST once; never follow redirects; read at most the stored response excerpt.

    `headers` (a mapping; an HTTPHeaderDict for repeated names) are sent exactly:
    each line, in order, and no client defaults beside them. webhooker's own
    messages (Slack, alerts) name it as their User-Agent; a `forwarded` event
    carries only the sender's.

    `timeout` (else DELIVERY_HTTP_TIMEOUT) bounds each connect and read, and also the
    whole attempt: a receiver that drips its answer is cut off when it runs out.
    """
    timeout = timeout or settings.DELIVERY_HTTP_TIMEOUT
    with watchdog.deadline(timeout) as deadline:
        try:
            s = session()
            prepared = s.prepare_request(requests.Request("POST", url, data=data))
            prepared.headers = exact_headers(prepared, headers, None if forwarded else USER_AGENT)
            response = s.send(
                prepared,
                timeout=timeout,
                allow_redirects=False,
                stream=True,
                # A private CA's bundle for receivers inside the network, or the
                # public roots.
                verify=settings.DELIVERY_CA_BUNDLE or True,
            )
        except requests.RequestException as exc:
            reason = blocked_reason(exc)
            if reason:
                return Outcome(success=False, error=f"blocked: {reason}", permanent=True)
            if deadline["expired"]:
                return Outcome(success=False, error=f"timed out after {timeout:g} s")
            return Outcome(success=False, error=describe(exc, timeout))
        try:
            excerpt = response.raw.read(RESPONSE_BODY_LIMIT, decode_content=True) or b""
        except Exception as exc:  # a receiver that breaks off (or drips) mid-body
            excerpt = f"<response body unreadable: {exc}>".encode()
        finally:
            response.close()
    code = response.status_code
    answered = "\n".join(f"{k}: {v}" for k, v in response.raw.headers.items())
    answered = answered[:RESPONSE_HEADERS_LIMIT]
    try:
        body = excerpt.decode(response.encoding or "utf-8", "replace")
    except LookupError:  # a charset Python does not know: still the receiver's answer
        body = excerpt.decode("utf-8", "replace")
    if 200 <= code < 300:
        return Outcome(
            success=True, status_code=code, response_body=body, response_headers=answered
        )
    retry_after = None
    if code in (429, 503):
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if 300 <= code < 400:
        error = f"HTTP {code}: redirects are not followed"
        if response.headers.get("Location"):
            error += f" (Location: {response.headers['Location'][:500]})"
    else:
        error = f"HTTP {code}"
    return Outcome(
        success=False,
        status_code=code,
        response_body=body,
        response_headers=answered,
        error=error,
        retry_after=retry_after,
        permanent=code == 410,
    )
