"""Outbound HTTP for the http and slack targets: one aiohttp session on one event
loop per process, behind the SSRF guard (guard.py).

Why asyncio: a receiver that answers in half a second holds a thread for half a
second; a coroutine waiting on it costs a few kilobytes and no thread switch.
bench/clients.py measured the candidates against the same receivers (bench/
RESULTS.md): aiohttp sends a POST for the CPU of a bare urllib3 POST and keeps
thousands in flight, where a thread per attempt costs twice the CPU.

The engine builds each request on its own threads (`Request`: the URL as
requests prepares it, the header lines exactly, the signature) and sends it on
the loop (`client.submit(send(request))`); everything else that sends (alerts, a
sync target call) waits for the same coroutine with `post()`.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import email.utils
import functools
import os
import selectors
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

import aiohttp
import requests
import requests.certs
import requests.utils
import yarl
from django.conf import settings
from multidict import CIMultiDict

from deliveries import ssrf
from deliveries.targets import egress
from deliveries.targets.base import (
    RESPONSE_BODY_LIMIT,
    RESPONSE_HEADERS_LIMIT,
    Outcome,
    TargetType,
)
from deliveries.targets.errors import connect_timed_out, describe, failure_class, let_go
from deliveries.targets.guard import (
    GuardedResolver,
    blocked_reason,
    is_literal,
    refused_literal,
)

USER_AGENT = "webhooker/0.1"
# The public roots requests ships (certifi's bundle).
_ROOTS = requests.certs.where()
# What aiohttp would add by itself: a delivery carries only the lines it was given.
_NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
# A receiver's header lines may be long (cookies): aiohttp's default stops at 8 KiB.
_LINE_LIMIT = 64 * 1024
# The attempt's own deadline runs this much past the connect timeout, so that a
# connect that takes the whole timeout says so rather than "timed out".
_CONNECT_FIRST = 0.05
_NO_ROUNDING = 1e9


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedURL:
    scheme: str
    host: str
    port: int | None
    path: str  # with the query
    authorization: str | None


@functools.lru_cache(maxsize=1024)
def prepared_url(url: str) -> PreparedURL:
    """`url` as requests would send it (IDNA host, quoted path), split, with the
    Basic Authorization its user:password stands for, if any. Targets are few and
    their URLs rarely change (an event's query string is appended after): the
    recent ones are parsed once, not on every attempt. Raises requests' InvalidURL /
    MissingSchema / InvalidSchema (never cached)."""
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


def _url(text: str, *, cache: bool) -> yarl.URL:
    """`text` as aiohttp takes it, as built (escapes as they are). A target's own
    URL, the same on each of its attempts, is parsed once; one with an event's
    query is not kept."""
    return _target_url(text) if cache else yarl.URL(text, encoded=True)


@functools.lru_cache(maxsize=1024)
def _target_url(text: str) -> yarl.URL:
    return yarl.URL(text, encoded=True)


@functools.lru_cache(maxsize=16)
def _tls_context(cafile: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)


def tls_context(ca_pem: str = "", cert_pem: str = "", key_pem: str = "") -> ssl.SSLContext:
    """Certificates verified against DELIVERY_CA_BUNDLE (a private CA) or the
    public roots requests ships, and a target's own CA (`ca_pem`); the target's
    client certificate presented (mutual TLS)."""
    cafile = settings.DELIVERY_CA_BUNDLE or _ROOTS
    if ca_pem or cert_pem:
        return egress.tls_context(cafile, ca_pem, cert_pem, key_pem)
    return _tls_context(cafile)


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


def exact_headers(own: dict, headers, user_agent) -> CIMultiDict:
    """`headers`, every line of them in order, and the request's `own` (the target
    URL's credentials) in place of any line of the same name. The URL's credentials
    are the target's configuration, which replaces what a sender sent, as
    configured headers do. Nothing else is added but Host and Content-Length."""
    named = {name.lower() for name in own}
    if hasattr(headers, "iteritems"):
        lines = headers.iteritems()
    elif hasattr(headers, "items"):
        lines = headers.items()
    else:
        lines = headers  # (name, value) pairs
    exact = CIMultiDict((name, value) for name, value in lines if name.lower() not in named)
    exact.update(own)
    if user_agent and "User-Agent" not in exact:
        exact["User-Agent"] = user_agent
    return exact


@dataclasses.dataclass(slots=True)
class Request:
    """One POST, built on the caller's thread, sent on the client's loop."""

    url: yarl.URL | None
    data: bytes
    headers: CIMultiDict
    timeout: float
    tls: ssl.SSLContext | None
    # Why it cannot be sent (an unusable URL, an address the guard refuses).
    refused: Outcome | None = None
    # Outcome fields the target fills in itself (what was sent, for the delivery
    # page), set on whatever the attempt comes to.
    shown: dict = dataclasses.field(default_factory=dict)
    # Asked when the loop starts the request (the engine: its lease still valid);
    # False, nothing is sent and the outcome is HELD_BACK.
    may_send: Callable[[], bool] | None = None
    # Sent through this forward proxy (egress.py), the destination vetted first.
    proxy: egress.Proxy | None = None
    # Sent with a token of this OAuth2 client (egress.py), fetched as needed.
    oauth: egress.OAuth2 | None = None


def request(
    url: str,
    *,
    data: bytes,
    headers,
    timeout: float | None,
    forwarded: bool = False,
    query: str = "",
    tls: tuple[str, str, str] = ("", "", ""),
    proxy: str | None = None,
    oauth: egress.OAuth2 | None = None,
) -> Request:
    """The POST to send: `query` appended to the URL's own query as it is, after
    `url` is prepared (preparing quotes again, decodes escapes of unreserved
    characters and, beside one stray "%", quotes every escape a second time: see
    http.forwardable_query), and sent as built, escapes in the sender's case.

    `headers` (a mapping, an HTTPHeaderDict for repeated names, or (name, value)
    pairs) are sent exactly: each line, in order, and no client defaults beside
    them. webhooker's own messages (Slack, alerts) name it as their User-Agent; a
    `forwarded` event carries only the sender's.

    `timeout` (else DELIVERY_HTTP_TIMEOUT) bounds the whole attempt: connect, send,
    and the answer to its last byte read.

    `tls` is a target's own (CA, client certificate, key), PEM; `proxy` its proxy
    URL (None: DELIVERY_PROXY's, "": none); `oauth` its token endpoint and client."""
    timeout = timeout or settings.DELIVERY_HTTP_TIMEOUT
    try:
        where = prepared_url(url)
    except (requests.RequestException, ValueError) as exc:
        return Request(None, data, CIMultiDict(), timeout, None, _failed(exc, timeout))
    path = where.path
    if query:
        path += ("&" if "?" in path else "?") + query
    host = f"[{where.host}]" if ":" in where.host else where.host
    port = f":{where.port}" if where.port is not None else ""
    own = {"Authorization": where.authorization} if where.authorization else {}
    refused = refused_literal(where.host)
    trusted = proxy is None  # DELIVERY_PROXY, the operator's own
    proxy = settings.DELIVERY_PROXY if proxy is None else proxy
    return Request(
        url=_url(f"{where.scheme}://{host}{port}{path}", cache=not query),
        data=data,
        headers=exact_headers(own, headers, None if forwarded else USER_AGENT),
        timeout=timeout,
        tls=(tls_context(*tls) if where.scheme == "https" else None),
        proxy=egress.proxy(proxy, trusted=trusted),
        oauth=oauth,
        refused=Outcome(
            success=False, error=f"blocked: {refused}", permanent=True, failure="blocked"
        )
        if refused
        else None,
    )


# Not sent: `may_send` said no when the loop came to it. Not an attempt.
HELD_BACK = Outcome(success=False, error="held back: not sent", held_back=True)


async def send(req: Request) -> Outcome:
    """POST once; never follow redirects; read at most the stored response excerpt."""
    if req.may_send is not None and not req.may_send():
        return HELD_BACK
    outcome = req.refused if req.refused is not None else await _post(req)
    return dataclasses.replace(outcome, **req.shown) if req.shown else outcome


async def _post(req: Request) -> Outcome:
    """The request, with a token if its target uses OAuth2: a token the receiver
    refuses (401) is fetched again once and the request sent once more."""
    if req.proxy is not None:
        try:
            async with asyncio.timeout(req.timeout):
                await _vet_destination(req)
        except (OSError, ssrf.BlockedAddress, TimeoutError) as exc:
            return _failed(exc, req.timeout)
    if req.oauth is None:
        return await _post_once(req, req.headers)
    try:
        # Token, request, and a refreshed token and request again: all within the
        # attempt's one deadline.
        async with asyncio.timeout(req.timeout + _CONNECT_FIRST):
            return await _post_with_token(req)
    except TimeoutError as exc:
        return _failed(exc, req.timeout)


async def _post_with_token(req: Request) -> Outcome:
    refused = None
    for _ in range(2):
        try:
            token = await egress.tokens.get(req.oauth, functools.partial(_fetch_token, req))
        except egress.TokenError as exc:
            return Outcome(success=False, error=f"OAuth2: {exc}", failure=exc.failure)
        headers = req.headers.copy()
        headers["Authorization"] = f"Bearer {token}"
        outcome = await _post_once(req, headers)
        if outcome.status_code != 401 or refused is not None:
            return outcome
        refused = token
        egress.tokens.forget(req.oauth, token)
    return outcome


async def _vet_destination(req: Request) -> None:
    """Through a proxy, the proxy resolves and connects: the guard decides on the
    destination here first, as it would on a direct connection (a name that
    resolves to a blocked address never reaches the proxy)."""
    host = req.url.raw_host
    if not is_literal(host):  # a literal was vetted when the request was built
        await client.guard.resolve(host, req.url.port or 0)
    if not req.proxy.trusted:
        # A target's own proxy: connected to at the address the guard vetted, so a
        # name that answers otherwise a moment later (rebinding) changes nothing.
        proxy = yarl.URL(req.proxy.url)
        if is_literal(proxy.raw_host):
            reason = refused_literal(proxy.raw_host)
            if reason:
                raise ssrf.BlockedAddress(f"proxy {reason}")
        else:
            vetted = await client.guard.resolve(proxy.raw_host, proxy.port or 0)
            req.proxy = dataclasses.replace(
                req.proxy, url=str(proxy.with_host(vetted[0]["host"])), trusted=True
            )


async def _fetch_token(req: Request) -> tuple[int, bytes]:
    """Ask the target's token endpoint (under the guard, through the target's
    proxy): (status, answer)."""
    oauth = req.oauth
    token_req = request(
        oauth.token_url,
        data=oauth.form(),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "Authorization": oauth.authorization(),
        },
        timeout=req.timeout,
        proxy=req.proxy.url if req.proxy else "",
    )
    if req.proxy is not None:
        token_req.proxy = req.proxy  # with its credentials, trusted or not
    if token_req.refused is not None:
        raise egress.TokenError(f"token endpoint {token_req.refused.error}", "blocked")
    try:
        if token_req.proxy is not None:
            await _vet_destination(token_req)
        async with asyncio.timeout(token_req.timeout + _CONNECT_FIRST):
            async with _session(token_req).post(
                token_req.url, data=token_req.data, **_options(token_req, token_req.headers)
            ) as response:
                return response.status, await _excerpt(response, egress.TOKEN_ANSWER_LIMIT)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError, ssrf.BlockedAddress) as exc:
        failed = _failed(exc, token_req.timeout)
        raise egress.TokenError(f"token endpoint: {failed.error}", failed.failure) from None


def _session(req: Request) -> aiohttp.ClientSession:
    return client.session(proxied=req.proxy is not None)


def _options(req: Request, headers) -> dict:
    options = {
        "headers": headers,
        "allow_redirects": False,
        "ssl": req.tls if req.tls is not None else True,
        # No rounding up to the next whole second (aiohttp's default past 5 s): the
        # connect must end before the attempt's deadline does.
        "timeout": aiohttp.ClientTimeout(
            total=None, sock_connect=req.timeout, ceil_threshold=_NO_ROUNDING
        ),
    }
    if req.proxy is not None:
        options["proxy"] = req.proxy.url
        if req.proxy.username or req.proxy.password:
            auth = egress.basic_authorization(req.proxy.username, req.proxy.password)
            if req.url.scheme == "https":  # on the CONNECT, never inside the tunnel
                options["proxy_headers"] = {"Proxy-Authorization": auth}
            else:  # plain http goes to the proxy as it is
                options["headers"] = headers.copy()
                options["headers"]["Proxy-Authorization"] = auth
    return options


async def _post_once(req: Request, headers) -> Outcome:
    try:
        async with asyncio.timeout(req.timeout + _CONNECT_FIRST):
            async with _session(req).post(
                req.url, data=req.data, **_options(req, headers)
            ) as response:
                try:
                    excerpt = await _excerpt(response)
                except (aiohttp.ClientError, OSError) as exc:  # broke off mid-body
                    excerpt = f"<response body unreadable: {exc}>".encode()
                    let_go(exc)
                # Read to its end, the connection goes back to the pool; a longer
                # answer's connection is closed rather than drained.
                response.release()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        return _failed(exc, req.timeout)
    return _answered(response, excerpt)


async def _excerpt(response, limit: int = RESPONSE_BODY_LIMIT) -> bytes:
    """The answer's body up to `limit` bytes, however many reads it takes."""
    chunks, size = [], 0
    while size < limit:
        chunk = await response.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _failed(exc: BaseException, timeout: float) -> Outcome:
    let_go(exc)  # its words are all the outcome keeps (errors.let_go)
    reason = blocked_reason(exc)
    if reason:
        return Outcome(success=False, error=f"blocked: {reason}", permanent=True, failure="blocked")
    if isinstance(exc, aiohttp.InvalidURL):
        # A host the client will never send to (say "1.2.3.4." with its dot): no
        # retry can help.
        return Outcome(
            success=False, error=describe(exc, timeout), permanent=True, failure="config"
        )
    if isinstance(exc, TimeoutError) and not connect_timed_out(exc):
        return Outcome(success=False, error=f"timed out after {timeout:g} s", failure="timeout")
    return Outcome(success=False, error=describe(exc, timeout), failure=failure_class(exc))


def _answered(response, excerpt: bytes) -> Outcome:
    code = response.status
    answered = "\n".join(f"{k}: {v}" for k, v in response.headers.items())[:RESPONSE_HEADERS_LIMIT]
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
        failure="status",
    )


def post(url: str, **kwargs) -> Outcome:
    """`request(url, **kwargs)` sent, waiting for its outcome (callers on threads
    of their own: alerts, a target called outside the engine)."""
    return wait(request(url, **kwargs))


def wait(req: Request) -> Outcome:
    # The attempt's own deadline ends it; the margin only guards against a loop
    # that stopped.
    return client.submit(send(req)).result(timeout=req.timeout + 30)


class SendsHTTP(TargetType):
    """A target type that delivers by one HTTP request (its request())."""

    def deliver(self, task, body) -> Outcome:
        return wait(self.request(task, body))


def _disowned(loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """The parent's loop, inherited by a forked child, made harmless to the parent:
    the copy's epoll descriptor names the parent's epoll instance, so an inherited
    transport closed in the child (a session collected) would take a kept-alive
    connection out of the parent's loop, whose next attempt on it would then hear
    nothing until its deadline. The copy gets an empty selector of its own.
    `_selector` is asyncio's (BaseSelectorEventLoop), the one private name of it
    webhooker touches (tests/unit/test_contracts.py)."""
    loop._selector = selectors.DefaultSelector()
    return loop


def _new_session(connector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),  # no receiver's cookie sent back
        skip_auto_headers=_NOT_ADDED,
        auto_decompress=True,
        trust_env=False,
        max_line_size=_LINE_LIMIT,
        max_field_size=_LINE_LIMIT,
    )


class Client:
    """The process's event loop for outbound HTTP, on a thread of its own, and the
    one aiohttp session on it: connections kept alive per receiver, shared by every
    attempt. Started on first use, and again in a forked child."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._pid = None
        # Requests handed over by start(), and whether the loop is told already.
        self._starts: collections.deque = collections.deque()
        self._told = False
        self._sending: set = set()  # the loop's tasks, held until done
        self._proxied: aiohttp.ClientSession | None = None
        # In a forked child: the parent's loop and sessions, never used or closed.
        self._inherited: list = []
        # Vets destinations sent through a proxy (_vet_destination).
        self.guard = GuardedResolver()

    def submit(self, coro) -> concurrent.futures.Future:
        """Run `coro` on the loop; its future completes on the loop's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._running_loop())

    def start(self, req: Request, done) -> None:
        """Send `req` on the loop; `done(outcome)` is called on the loop's thread.
        Requests started while the loop has not yet picked up the last ones wake
        it once between them (a wake-up is a write to its self-pipe)."""
        loop = self._running_loop()
        self._starts.append((req, done))
        if not self._told:
            self._told = True
            loop.call_soon_threadsafe(self._take_starts)

    def _take_starts(self) -> None:
        # Untold first: a start() after this line tells the loop again, and one
        # before it is taken below.
        self._told = False
        loop = asyncio.get_running_loop()
        while self._starts:
            req, done = self._starts.popleft()
            task = loop.create_task(send(req))
            self._sending.add(task)
            task.add_done_callback(functools.partial(self._sent, done))

    def _sent(self, done, task) -> None:
        self._sending.discard(task)
        try:
            outcome = task.result()
        except BaseException as exc:  # a bug in send(), or the loop closing
            outcome = Outcome(
                success=False, error=f"{type(exc).__name__}: {exc}", failure="internal"
            )
        done(outcome)

    def session(self, *, proxied: bool = False) -> aiohttp.ClientSession:
        """The session (on the loop's thread only); `proxied`, the one whose
        connections go to forward proxies, which the operator chose: its resolver
        is the system's, the destinations are vetted by `guard` before sending."""
        if proxied:
            if self._proxied is None:
                self._proxied = _new_session(aiohttp.TCPConnector(limit=0))
            return self._proxied
        if self._session is None:
            self._session = _new_session(
                aiohttp.TCPConnector(limit=0, use_dns_cache=False, resolver=GuardedResolver())
            )
        return self._session

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            return loop  # every attempt asks: no lock once it runs
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                if self._loop is not None:  # a forked child: the parent's are inherited
                    self._inherited.append((_disowned(self._loop), self._session, self._proxied))
                self._pid = os.getpid()
                self._session = self._proxied = None
                self._starts.clear()
                self._told = False
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="http-client", daemon=True
                ).start()
            return self._loop

    def close(self) -> None:
        """Close the kept-alive connections and stop the loop (tests, shutdown)."""
        if self._pid != os.getpid():
            return  # a forked child's inherited loop runs in no thread of its own
        with self._lock:
            loop, sessions = self._loop, (self._session, self._proxied)
            self._loop = self._session = self._proxied = None
        if loop is None:
            return
        for session in sessions:
            if session is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(session.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)


client = Client()
atexit.register(client.close)
