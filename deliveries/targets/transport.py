"""Outbound HTTP for the http and slack targets: urllib3's connection pools, one
set per worker thread, behind the SSRF guard (guard.py).

requests prepares each target's URL once (IDNA host, quoted path, credentials as
Basic auth: `prepared_url`); the POST itself goes straight to urllib3, the layer
under requests. requests' own sending path (its adapter and Response) added
nothing a delivery wants and cost an eighth of an engine's CPU at full load:
proxy lookup from the environment and cookie extraction on every attempt, a
Response object around urllib3's, the pool looked up through the TLS settings
twice. A Session would add worse: a cookie jar (a receiver's Set-Cookie sent back
on later deliveries to that host, a header no sender sent).

Each worker thread keeps its own pools, so an attempt never waits on another
thread's connection and a kept-alive connection is reused by the thread that
opened it.
"""

import dataclasses
import email.utils
import functools
import threading
import time
import urllib.parse

import requests
import requests.certs
import requests.utils
from django.conf import settings
from urllib3 import HTTPHeaderDict, PoolManager, Timeout
from urllib3.exceptions import HTTPError
from urllib3.util import SKIP_HEADER

from deliveries.targets.base import RESPONSE_BODY_LIMIT, RESPONSE_HEADERS_LIMIT, Outcome
from deliveries.targets.deadline import watchdog
from deliveries.targets.errors import connect_timed_out, describe
from deliveries.targets.guard import blocked_reason, exact_target, guarded_pools

_local = threading.local()

USER_AGENT = "webhooker/0.1"
# Hosts a worker thread keeps a connection to (one each: a thread makes one attempt
# at a time); past this the least recently used is closed. requests' default.
POOLS_PER_THREAD = 10
# The public roots requests ships (certifi's bundle).
_ROOTS = requests.certs.where()


def pools() -> PoolManager:
    found = getattr(_local, "pools", None)
    if found is None:
        found = _local.pools = guarded_pools(num_pools=POOLS_PER_THREAD, maxsize=1)
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedURL:
    scheme: str
    host: str
    port: int | None
    path: str  # with the query
    authorization: str | None


@functools.lru_cache(maxsize=1024)
def prepared_url(url: str) -> PreparedURL:
    """`url` as requests would send it (IDNA host, quoted path), split for urllib3,
    with the Basic Authorization its user:password stands for, if any. Targets are
    few and their URLs rarely change (an event's query string is appended after,
    by post): the recent ones are parsed once, not on every attempt. Raises requests'
    InvalidURL / MissingSchema / InvalidSchema (never cached)."""
    request = requests.PreparedRequest()
    request.prepare_url(url, None)
    request.prepare_headers(None)
    request.prepare_auth(None)
    parts = urllib.parse.urlsplit(request.url)
    return PreparedURL(
        scheme=parts.scheme.lower(),
        host=parts.hostname,
        port=parts.port,
        path=request.path_url,
        authorization=request.headers.get("Authorization"),
    )


def tls_settings() -> dict:
    """The pool settings of https targets: certificates verified against
    DELIVERY_CA_BUNDLE (a private CA) or the public roots requests ships."""
    return {"cert_reqs": "CERT_REQUIRED", "ca_certs": settings.DELIVERY_CA_BUNDLE or _ROOTS}


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
    """`headers`, every line of them, and the request's `own` (Content-Length, the
    target URL's credentials) in place of any line of the same name, and nothing
    the HTTP libraries would add by default. The URL's credentials are the
    target's configuration, which replaces what a sender sent, as configured
    headers do."""
    named = _lower(own)
    exact = HTTPHeaderDict()
    for name, value in headers.items():
        if name.lower() not in named:
            exact.add(name, value)
    exact.update(own)
    if "User-Agent" not in exact:
        exact["User-Agent"] = user_agent or SKIP_HEADER
    if "Accept-Encoding" not in exact:
        exact["Accept-Encoding"] = SKIP_HEADER
    return exact


def _lower(headers) -> set:
    return {name.lower() for name in headers}


def post(
    url: str,
    *,
    data: bytes,
    headers,
    timeout: float | None,
    forwarded: bool = False,
    query: str = "",
) -> Outcome:
    """POST once; never follow redirects; read at most the stored response excerpt.

    `query` is appended to the URL's own query as it is, after `url` is prepared:
    preparing quotes again, decodes escapes of unreserved characters and, beside
    one stray "%", quotes every escape a second time (see http.forwardable_query);
    and sent as built, escapes in the sender's case (guard.exact_target).

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
            where = prepared_url(url)
            path = where.path
            if query:
                path += ("&" if "?" in path else "?") + query
            own = {"Content-Length": str(len(data))}
            if where.authorization:
                own["Authorization"] = where.authorization
            pool = pools().connection_from_host(
                where.host,
                where.port,
                where.scheme,
                pool_kwargs=tls_settings() if where.scheme == "https" else None,
            )
            sent_as_built = exact_target.set(path)
            try:
                response = pool.urlopen(
                    "POST",
                    path,
                    body=data,
                    headers=exact_headers(own, headers, None if forwarded else USER_AGENT),
                    retries=False,
                    redirect=False,
                    assert_same_host=False,
                    timeout=Timeout(connect=timeout, read=timeout),
                    preload_content=False,
                )
            finally:
                exact_target.reset(sent_as_built)
        except (requests.RequestException, HTTPError, OSError) as exc:
            reason = blocked_reason(exc)
            if reason:
                return Outcome(success=False, error=f"blocked: {reason}", permanent=True)
            # The whole attempt's deadline passed (a connect that took all of it
            # says so by itself).
            if deadline["expired"] and not connect_timed_out(exc):
                return Outcome(success=False, error=f"timed out after {timeout:g} s")
            return Outcome(success=False, error=describe(exc, timeout))
        try:
            excerpt = response.read(RESPONSE_BODY_LIMIT, decode_content=True) or b""
        except Exception as exc:  # a receiver that breaks off (or drips) mid-body
            excerpt = f"<response body unreadable: {exc}>".encode()
        finally:
            # Read to its end, the body's connection went back to the pool; a
            # longer one is closed rather than drained.
            response.close()
    code = response.status
    answered = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    answered = answered[:RESPONSE_HEADERS_LIMIT]
    encoding = requests.utils.get_encoding_from_headers(response.headers) or "utf-8"
    try:
        body = excerpt.decode(encoding, "replace")
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
