"""What a company's receiver asks of a request beyond a URL and headers: a client
certificate (mutual TLS) and the CA that signs its own certificate, Basic auth, an
OAuth2 token (client credentials), a forward proxy. An http target's config holds
them (encrypted at rest with the rest of it); this module checks them when the
target is saved and turns them into what transport.py sends with.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import functools
import json
import os
import ssl
import time
import urllib.parse

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from django.core.exceptions import ValidationError

# A client certificate this close to its end is warned about on the target's page
# and in an alert.
EXPIRY_WARNING = datetime.timedelta(days=30)
# A token is used until this long before it expires (a tenth of its life at most).
TOKEN_MARGIN = 60.0
# A token endpoint that says nothing of expiry: its token is kept this long.
TOKEN_DEFAULT_LIFE = 300.0
# How much of a token endpoint's answer is read.
TOKEN_ANSWER_LIMIT = 64 * 1024


# --- mutual TLS -----------------------------------------------------------------


def _certificate(pem: str, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        raise ValidationError(f"The {what} is not a PEM certificate.") from None


def check_tls(cert_pem: str, key_pem: str, ca_pem: str, now=None, *, dates=True) -> None:
    """Refuse a client certificate without its key or with another one, one that is
    expired or not yet valid (`dates`: a certificate given now, not one saved
    before), and a CA that is not PEM certificates."""
    now = now or datetime.datetime.now(datetime.UTC)
    if bool(cert_pem) != bool(key_pem):
        raise ValidationError(
            "A client certificate needs its private key, and a key its certificate."
        )
    if cert_pem:
        cert = _certificate(cert_pem, "client certificate")
        try:
            key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        except TypeError:
            raise ValidationError(
                "The private key is encrypted: give it without its passphrase (it is "
                "stored encrypted)."
            ) from None
        except (ValueError, UnsupportedAlgorithm):
            raise ValidationError("The private key is not a PEM private key.") from None
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
            raise ValidationError("The private key does not match the client certificate.")
        if dates and cert.not_valid_after_utc <= now:
            raise ValidationError(
                f"The client certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC."
            )
        if dates and cert.not_valid_before_utc > now:
            raise ValidationError(
                "The client certificate is not valid before "
                f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC."
            )
    if ca_pem:
        try:
            x509.load_pem_x509_certificates(ca_pem.encode())
        except ValueError:
            raise ValidationError("The receiver's CA is not PEM certificates.") from None


def certificate_expiry(config: dict) -> datetime.datetime | None:
    """When the config's client certificate expires (None: it has none, or an
    unreadable one)."""
    pem = config.get("tls_client_cert") if isinstance(config, dict) else None
    if not pem:
        return None
    try:
        return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc
    except ValueError:
        return None


def expiry_warning(config: dict, now=None) -> str:
    """Words about a client certificate that expires within EXPIRY_WARNING ("" if
    it does not)."""
    expires = certificate_expiry(config)
    now = now or datetime.datetime.now(datetime.UTC)
    if expires is None or expires - now > EXPIRY_WARNING:
        return ""
    if expires <= now:
        return f"Its client certificate expired on {expires:%Y-%m-%d} UTC: receivers refuse it."
    return (
        f"Its client certificate expires on {expires:%Y-%m-%d} UTC "
        f"(in {(expires - now).days} days): replace it before then."
    )


@functools.lru_cache(maxsize=256)
def tls_context(
    cafile: str, ca_pem: str = "", cert_pem: str = "", key_pem: str = ""
) -> ssl.SSLContext:
    """Receivers' certificates verified against `cafile` (and `ca_pem`, a target's
    own CA), presenting the client certificate if given. One context per distinct
    set, kept: building one reads the trust store. The key reaches OpenSSL through
    an anonymous in-memory file, never the disk."""
    context = ssl.create_default_context(cafile=cafile)
    if ca_pem:
        context.load_verify_locations(cadata=ca_pem)
    if cert_pem:
        fd = os.memfd_create("client-certificate", os.MFD_CLOEXEC)
        try:
            os.write(fd, f"{cert_pem.strip()}\n{key_pem.strip()}\n".encode())
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    return context


# --- Basic auth and proxies -----------------------------------------------------


def basic_authorization(username: str, password: str) -> str:
    """The Authorization header value of Basic auth (RFC 7617, UTF-8)."""
    raw = f"{username}:{password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclasses.dataclass(frozen=True, slots=True)
class Proxy:
    """A forward proxy: its URL without credentials, and them apart."""

    url: str
    username: str = ""
    password: str = ""
    # DELIVERY_PROXY, the operator's: connected to as it is. A target's own proxy
    # is vetted by the SSRF guard first, like any address a target names.
    trusted: bool = False


def proxy_problem(url: str) -> str | None:
    """What is wrong with `url` as a proxy, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return "A proxy is an http:// URL (https targets go through it with CONNECT)."
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "A proxy URL is a scheme, credentials, host and port only."
    try:
        parts.port  # noqa: B018 (raises for a port out of range)
    except ValueError:
        return "The proxy's port is not a port number."
    return None


def proxy(url: str, *, trusted: bool = False) -> Proxy | None:
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port else ""
    return Proxy(
        url=f"http://{host}{port}",
        username=urllib.parse.unquote(parts.username or ""),
        password=urllib.parse.unquote(parts.password or ""),
        trusted=trusted,
    )


# --- OAuth2 client credentials ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class OAuth2:
    """A target's token endpoint and client (RFC 6749 §4.4). Frozen: it is the key
    its tokens are kept under, so a changed secret or scope takes a new token."""

    token_url: str
    client_id: str
    client_secret: str = dataclasses.field(repr=False)
    scope: str = ""
    audience: str = ""

    def form(self) -> bytes:
        fields = {"grant_type": "client_credentials"}
        if self.scope:
            fields["scope"] = self.scope
        if self.audience:
            fields["audience"] = self.audience
        return urllib.parse.urlencode(fields).encode()

    def authorization(self) -> str:
        # client_secret_basic, which every authorization server must accept
        # (RFC 6749 §2.3.1): id and secret form-encoded, then Basic.
        quote = functools.partial(urllib.parse.quote, safe="")
        return basic_authorization(quote(self.client_id), quote(self.client_secret))


class TokenError(Exception):
    """No token: what the endpoint answered, in words (never the secret), and the
    failure class of the attempt it fails."""

    def __init__(self, message: str, failure: str):
        super().__init__(message)
        self.failure = failure


def read_token(status: int, body: bytes) -> tuple[str, float]:
    """(access token, seconds it lives) from a token endpoint's answer; TokenError
    with the endpoint's own error code and description otherwise."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        answer = {}
    if status != 200:
        words = ": ".join(
            str(answer[key])[:200] for key in ("error", "error_description") if answer.get(key)
        )
        raise TokenError(
            f"token endpoint answered {status}" + (f": {words}" if words else ""), "status"
        )
    token = answer.get("access_token")
    if not isinstance(token, str) or not token:
        raise TokenError("token endpoint answered 200 without an access_token", "answer")
    life = answer.get("expires_in")
    if isinstance(life, str) and life.isdigit():
        life = int(life)
    if not isinstance(life, int | float) or isinstance(life, bool) or life <= 0:
        life = TOKEN_DEFAULT_LIFE
    return token, float(life)


class Tokens:
    """Access tokens per OAuth2 client, kept until shortly before they expire;
    used on the HTTP client's loop only. One fetch at a time per client: attempts
    that need a token while it is being fetched wait for that one."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._tokens: dict[OAuth2, tuple[str, float]] = {}
        self._fetching: dict[OAuth2, asyncio.Future] = {}

    async def get(self, oauth: OAuth2, fetch) -> str:
        """A valid token for `oauth`; `fetch()` (a coroutine: (status, body)) asks
        the endpoint when none is kept. Raises TokenError."""
        kept = self._tokens.get(oauth)
        if kept is not None and kept[1] > self._clock():
            return kept[0]
        pending = self._fetching.get(oauth)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._fetching[oauth] = future
        try:
            status, body = await fetch()
            token, life = read_token(status, body)
            self._tokens[oauth] = token, self._clock() + life - min(TOKEN_MARGIN, life / 10)
            future.set_result(token)
            return token
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a fetch no one else waited for logs nothing
            raise
        finally:
            del self._fetching[oauth]

    def forget(self, oauth: OAuth2, token: str) -> None:
        """`token` was refused (401): the next get() fetches another."""
        if self._tokens.get(oauth, ("",))[0] == token:
            del self._tokens[oauth]


tokens = Tokens()
