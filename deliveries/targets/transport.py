"""Outbound HTTP for the http and slack targets: requests' transport adapter, one
per thread, with no Session around it.

The adapter keeps connections alive between attempts to the same host; it is not
safe to share between threads, so each worker thread builds its own on first use.
A Session would add nothing a delivery wants and two things it must not have: a
cookie jar (a receiver's Set-Cookie sent back on later deliveries to that host, a
header no sender sent) and the merging of session settings into every request,
which cost a fifth of an attempt's CPU.
"""

import email.utils
import functools
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


def adapter() -> GuardedAdapter:
    found = getattr(_local, "adapter", None)
    if found is None:
        found = _local.adapter = GuardedAdapter()
    return found


@functools.lru_cache(maxsize=1024)
def prepared_url(url: str) -> tuple[str, str | None]:
    """`url` as requests sends it (IDNA host, quoted path), and the Basic
    Authorization its user:password, if any, stands for. Targets are few and
    their URLs rarely change (an event's query string appended makes a new one):
    the recent ones are parsed once, not on every attempt. Raises
    requests' InvalidURL / MissingSchema / InvalidSchema (never cached)."""
    request = requests.PreparedRequest()
    request.prepare_url(url, None)
    request.prepare_headers(None)
    request.prepare_auth(None)
    return request.url, request.headers.get("Authorization")


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


def exact_headers(own: dict, headers, user_agent) -> HTTPHeaderDict:
    """The request's `own` headers (Content-Length, the URL's credentials) and
    `headers`, every line of them, and nothing the HTTP libraries would add by
    default. `headers` win over `own` of the same name."""
    named = _lower(headers)
    exact = HTTPHeaderDict({k: v for k, v in own.items() if k.lower() not in named})
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
            request = requests.PreparedRequest()
            request.method = "POST"
            request.url, authorization = prepared_url(url)
            own = {"Content-Length": str(len(data))}
            if authorization:
                own["Authorization"] = authorization
            request.headers = exact_headers(own, headers, None if forwarded else USER_AGENT)
            request.body = data
            response = adapter().send(
                request,
                timeout=timeout,
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
