import functools
import numbers
import time
import urllib.parse

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone
from urllib3 import HTTPHeaderDict

from deliveries import signing
from deliveries.targets import egress, transport
from deliveries.targets.base import (
    MASK,
    SecretField,
    TargetURLField,
    mask_url,
    masked_headers,
    require_url,
)

# RFC 9110 §7.6.1 hop-by-hop headers, plus the ones the transport sets itself.
DROPPED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # The sender's handshake with webhooker, not a request to the target: the
        # transport sends the body at once and has no 100 Continue to wait for.
        "expect",
    }
)
MAX_TIMEOUT = 300


def forwarded_headers(task, extra: dict) -> HTTPHeaderDict:
    """The event's header lines minus hop-by-hop ones, plus config and webhooker
    headers. Repeated lines stay apart and in order; a config header replaces
    every line of its name."""
    lines = [(name.lower(), name, value) for name, value in task.headers]
    listed = DROPPED_HEADERS
    for lowered, _, value in lines:
        if lowered == "connection":
            listed = listed | {token.strip().lower() for token in value.split(",")}
    headers = HTTPHeaderDict()
    for lowered, name, value in lines:
        if lowered not in listed and not lowered.startswith("x-webhooker-"):
            headers.add(name, value)
    if task.content_type and "Content-Type" not in headers:
        # An event stored without its header lines (the API's, say) still says
        # what its body is; the lines, when there are some, are what was sent (the
        # column is cut at 255 characters and merges repeated lines).
        headers["Content-Type"] = task.content_type
    headers.update(extra)
    headers["X-Webhooker-Event"] = str(task.event_code)
    headers["X-Webhooker-Delivery"] = str(task.delivery_id)
    return headers


class HeadersField(forms.CharField):
    """Extra headers in the target form, one `Name: value` per line.

    Their values are often credentials: the form shows them masked, and a line
    sent back with the mask keeps the value stored (base.keep_secrets)."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": "X-Token: secret"})

    def shown(self, stored):
        return dict.fromkeys(stored, MASK) if isinstance(stored, dict) else stored

    def prepare_value(self, value):
        if isinstance(value, dict):  # as shown(): one line per header, values masked
            return "\n".join(f"{k}: {v}" for k, v in value.items())
        return value

    def to_python(self, value):
        headers = {}
        for n, line in enumerate((value or "").splitlines(), 1):
            if not line.strip():
                continue
            name, sep, val = line.partition(":")
            name, val = name.strip(), val.strip()
            if not sep or not _token(name) or _has_newline(val):
                raise ValidationError(f"Line {n} is not a valid 'Name: value' header.")
            if name.lower() in DROPPED_HEADERS:
                raise ValidationError(f"Line {n}: {name} is set by webhooker itself.")
            headers[name] = val
        return headers


class HttpTarget(transport.SendsHTTP):
    type = "http"
    label = "HTTP endpoint"
    retries = True
    main_field = "url"

    @classmethod
    def clean_config(cls, config, *, stored=None):
        cleaned = {"url": require_url(config, "url")}
        headers = config.get("headers") or {}
        if not isinstance(headers, dict):
            raise ValidationError("'headers' must be an object of header names to values.")
        for name, value in headers.items():
            if not isinstance(value, str) or not _token(name) or _has_newline(value):
                raise ValidationError(f"Header {name!r} is not a valid header name and value.")
            if name.lower() in DROPPED_HEADERS:
                raise ValidationError(f"Header {name!r} is set by webhooker itself.")
        if headers:
            cleaned["headers"] = headers
        timeout = config.get("timeout")
        if timeout not in (None, ""):
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, numbers.Real)
                or not 0 < timeout <= MAX_TIMEOUT
            ):
                raise ValidationError(
                    f"'timeout' must be a number of seconds above 0 and at most {MAX_TIMEOUT}."
                )
            cleaned["timeout"] = timeout
        drop_query = config.get("drop_query", False)
        if not isinstance(drop_query, bool):
            raise ValidationError("'drop_query' must be true or false.")
        if drop_query:
            cleaned["drop_query"] = True
        # A client certificate saved already had its dates checked when it was given:
        # an expired one still lets the rest of the target be edited.
        known = (stored or {}).get("tls_client_cert", "")
        cleaned.update(_clean_egress(config, cleaned["url"], headers, known))
        unknown = set(config) - {"url", "headers", "timeout", "drop_query", *EGRESS}
        if unknown:
            raise ValidationError(f"Unknown keys for an http target: {', '.join(sorted(unknown))}.")
        return cleaned

    @classmethod
    def form_fields(cls):
        return {
            "url": TargetURLField(
                label="URL",
                help_text="HTTP targets: where the event is POSTed (http:// or https://).",
                error_messages={"required": "An HTTP target needs a URL."},
            ),
            "headers": HeadersField(
                required=False, help_text="HTTP targets: extra headers, one 'Name: value' per line."
            ),
            "timeout": forms.FloatField(
                required=False,
                min_value=0.1,
                max_value=MAX_TIMEOUT,
                help_text="HTTP targets: seconds per attempt (empty: the engine's default).",
            ),
            "drop_query": forms.BooleanField(
                required=False,
                label="Drop query string",
                help_text="HTTP targets: do not append the query string an event was "
                "received with to the URL's own query.",
            ),
            "basic_username": forms.CharField(
                required=False, label="Basic auth user", help_text="HTTP targets: Basic auth."
            ),
            "basic_password": SecretField(
                required=False, label="Basic auth password", widget=_secret_input()
            ),
            "oauth_token_url": TargetURLField(
                required=False,
                label="OAuth2 token URL",
                help_text="HTTP targets: a token is fetched with the client credentials grant "
                "and sent as Authorization: Bearer.",
            ),
            "oauth_client_id": forms.CharField(required=False, label="OAuth2 client id"),
            "oauth_client_secret": SecretField(
                required=False, label="OAuth2 client secret", widget=_secret_input()
            ),
            "oauth_scope": forms.CharField(required=False, label="OAuth2 scope"),
            "oauth_audience": forms.CharField(required=False, label="OAuth2 audience"),
            "tls_client_cert": forms.CharField(
                required=False,
                label="Client certificate",
                widget=forms.Textarea(
                    attrs={"rows": 3, "placeholder": "-----BEGIN CERTIFICATE-----"}
                ),
                help_text="HTTPS targets: mutual TLS, PEM.",
            ),
            "tls_client_key": SecretField(
                required=False,
                label="Client key",
                widget=forms.Textarea(
                    attrs={"rows": 3, "placeholder": "-----BEGIN PRIVATE KEY-----"}
                ),
                help_text="Its private key, PEM, without a passphrase; never shown again.",
            ),
            "tls_ca_cert": forms.CharField(
                required=False,
                label="Receiver's CA",
                widget=forms.Textarea(attrs={"rows": 3}),
                help_text="HTTPS targets: the CA that signs the receiver's certificate, PEM "
                "(beside the public roots and DELIVERY_CA_BUNDLE).",
            ),
            "proxy": TargetURLField(
                required=False,
                label="Proxy",
                help_text="HTTP targets: http://[user:password@]host:port, in place of "
                "DELIVERY_PROXY.",
            ),
        }

    def request(self, task, body) -> transport.Request:
        config = task.target.config
        headers = forwarded_headers(task, config.get("headers", {}))
        if task.span is not None and task.target.traceparent:
            # The attempt's own context, in place of the sender's: the receiver's
            # spans join the event's trace under this attempt (tracing.py).
            for name in ("traceparent", "tracestate"):
                headers.discard(name)
            headers.update(task.span.headers())
        if task.target.signing:
            sign(headers, task, body)
        url = config["url"]
        if _has_userinfo(url):
            # The URL's credentials are sent as Basic auth (transport.request), in
            # place of the sender's, as configured headers replace theirs.
            headers.discard("Authorization")
        if config.get("basic_username"):
            headers["Authorization"] = egress.basic_authorization(
                config["basic_username"], config.get("basic_password", "")
            )
        query = "" if config.get("drop_query") else forwardable_query(task.query_string)
        lines = list(headers.iteritems())
        req = transport.request(
            url,
            data=body,
            headers=lines,
            timeout=config.get("timeout"),
            forwarded=True,
            query=query,
            tls=(
                config.get("tls_ca_cert", ""),
                config.get("tls_client_cert", ""),
                config.get("tls_client_key", ""),
            ),
            proxy=config.get("proxy") or None,
            oauth=_oauth(config),
        )
        req.shown = {
            "request_url": _shown_url(url, query),
            "request_headers": masked_headers(lines, config.get("headers", {})),
        }
        return req


# Egress settings of an http target's config (egress.py); the secrets among them
# are SecretFields (form_fields), never shown back once saved.
EGRESS = (
    "basic_username",
    "basic_password",
    "oauth_token_url",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
    "oauth_audience",
    "tls_client_cert",
    "tls_client_key",
    "tls_ca_cert",
    "proxy",
)
OAUTH = ("oauth_token_url", "oauth_client_id", "oauth_client_secret")


def _secret_input():
    return forms.TextInput(attrs={"autocomplete": "off", "size": 40})


def _clean_egress(config: dict, url: str, headers: dict, known_certificate: str = "") -> dict:
    """The egress settings of `config`, checked; ValidationError in words."""
    cleaned = {}
    for key in EGRESS:
        value = config.get(key)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise ValidationError(f"'{key}' must be a string.")
        cleaned[key] = value.strip() if key.startswith("tls_") else value
    named = {name.lower() for name in headers}
    if cleaned.get("basic_password") and not cleaned.get("basic_username"):
        raise ValidationError("A Basic auth password needs its user.")
    if "basic_username" in cleaned and urllib.parse.urlsplit(url).username is not None:
        raise ValidationError("Give the credentials in the URL or as Basic auth, not both.")
    oauth = [key for key in cleaned if key.startswith("oauth_")]
    if oauth:
        missing = [key for key in OAUTH if key not in cleaned]
        if missing:
            raise ValidationError(f"OAuth2 needs {', '.join(missing)} too.")
        if "basic_username" in cleaned:
            raise ValidationError("Basic auth or OAuth2, not both.")
        require_url(cleaned, "oauth_token_url")
    if (oauth or "basic_username" in cleaned) and "authorization" in named:
        raise ValidationError("An Authorization header and Basic auth or OAuth2: choose one.")
    tls = [cleaned.get(k, "") for k in ("tls_client_cert", "tls_client_key", "tls_ca_cert")]
    if any(tls):
        if urllib.parse.urlsplit(url).scheme != "https":
            raise ValidationError("A client certificate or a CA applies to https:// URLs only.")
        egress.check_tls(*tls, dates=tls[0] != known_certificate.strip())
    if "proxy" in cleaned:
        problem = egress.proxy_problem(cleaned["proxy"])
        if problem:
            raise ValidationError(problem)
        require_url(cleaned, "proxy")  # the guard decides on a target's own proxy too
    return cleaned


def _oauth(config: dict) -> egress.OAuth2 | None:
    if not config.get("oauth_token_url"):
        return None
    return egress.OAuth2(
        token_url=config["oauth_token_url"],
        client_id=config["oauth_client_id"],
        client_secret=config["oauth_client_secret"],
        scope=config.get("oauth_scope", ""),
        audience=config.get("oauth_audience", ""),
    )


@functools.lru_cache(maxsize=1024)
def _has_userinfo(url: str) -> bool:
    """Whether `url` names a user (a target's URL, asked on every attempt)."""
    return urllib.parse.urlsplit(url).username is not None


@functools.lru_cache(maxsize=1024)
def _shown_url(url: str, query: str) -> str:
    """The URL an attempt went to, as its result shows it (most attempts of a
    target go to the same one: the recent ones are kept)."""
    return mask_url(with_query(url, query))


def with_query(url: str, query: str) -> str:
    """`url` with `query` appended to its own query, both kept as they are."""
    if not query:
        return url
    parts = urllib.parse.urlsplit(url)
    joined = f"{parts.query}&{query}" if parts.query else query
    return urllib.parse.urlunsplit(parts._replace(query=joined))


# What a URL's query may carry as it is (RFC 3986: unreserved, sub-delims, ":@/?").
_QUERY_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/?"
)
_HEX = frozenset("0123456789abcdefABCDEF")


def forwardable_query(query: str) -> str:
    """The query string as received, as a URL can carry it: each escape as the
    sender sent it, a "%" that starts none as %25, and each byte a URL may not
    carry (space, "{", "|", non-ASCII, ...) percent-encoded; nothing decoded. The
    HTTP client then sends it unchanged. (The stored query is the request's bytes
    read as Latin-1.)"""
    out = []
    i = 0
    while i < len(query):
        char = query[i]
        if char == "%" and query[i + 1 : i + 2] in _HEX and query[i + 2 : i + 3] in _HEX:
            out.append(query[i : i + 3])
            i += 3
            continue
        if char in _QUERY_CHARS:
            out.append(char)
        else:
            raw = char.encode("latin-1") if ord(char) < 256 else char.encode("utf-8")
            out.extend(f"%{byte:02X}" for byte in raw)
        i += 1
    return "".join(out)


def sign(headers: HTTPHeaderDict, task, body: bytes) -> None:
    """Add the Standard Webhooks headers for this attempt, in place of any the
    sender's own request carried (they would not verify with our secret)."""
    target = task.target
    secrets = signing.valid_secrets(
        target.signing_secret,
        target.previous_signing_secret,
        target.secret_rotated_at,
        timezone.now(),
        settings.SIGNING_ROTATION_OVERLAP,
    )
    if not secrets:
        return
    for name in [n for n in headers if n.lower() in signing.HEADERS]:
        del headers[name]
    msg_id = signing.message_id(task.event_code, task.target_id)
    headers.update(signing.headers(secrets, msg_id, int(time.time()), body))


_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def valid_header(name, value: str) -> bool:
    """Whether `name: value` is one header line webhooker can send."""
    return _token(name) and not _has_newline(value)


def _token(name) -> bool:
    return isinstance(name, str) and bool(name) and set(name) <= _TOKEN_CHARS


def _has_newline(value: str) -> bool:
    return "\r" in value or "\n" in value or "\0" in value
