import numbers
import time
import urllib.parse

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone
from urllib3 import HTTPHeaderDict

from deliveries import signing
from deliveries.targets import transport
from deliveries.targets.base import (
    MASK,
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
    listed = set(DROPPED_HEADERS)
    for name, value in task.headers:
        if name.lower() == "connection":
            listed.update(token.strip().lower() for token in value.split(","))
    headers = HTTPHeaderDict()
    for name, value in task.headers:
        if name.lower() not in listed and not name.lower().startswith("x-webhooker-"):
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
    sent back with the mask keeps the value stored (keep_masked)."""

    MASK = MASK
    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": "X-Token: secret"})

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{k}: {self.MASK}" for k in value)
        return value

    def keep_masked(self, headers: dict, stored: dict) -> dict:
        """`headers` with each masked value replaced by the stored one."""
        stored = stored if isinstance(stored, dict) else {}
        kept = {}
        for name, value in headers.items():
            if value == self.MASK:
                if name not in stored:
                    raise ValidationError(f"Type the value of {name} (it was not set before).")
                value = stored[name]
            kept[name] = value
        return kept

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
    def clean_config(cls, config):
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
        unknown = set(config) - {"url", "headers", "timeout", "drop_query"}
        if unknown:
            raise ValidationError(f"Unknown keys for an http target: {', '.join(sorted(unknown))}.")
        return cleaned

    @classmethod
    def shown_config(cls, config):
        shown = {**config, "url": mask_url(config.get("url"))}
        if config.get("headers"):
            shown["headers"] = dict.fromkeys(config["headers"], MASK)
        return shown

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
        }

    def request(self, task, body) -> transport.Request:
        config = task.target.config
        headers = forwarded_headers(task, config.get("headers", {}))
        if task.target.signing:
            sign(headers, task, body)
        url = config["url"]
        if urllib.parse.urlsplit(url).username is not None:
            # The URL's credentials are sent as Basic auth (transport.request), in
            # place of the sender's, as configured headers replace theirs.
            headers.discard("Authorization")
        query = "" if config.get("drop_query") else forwardable_query(task.query_string)
        req = transport.request(
            url,
            data=body,
            headers=headers,
            timeout=config.get("timeout"),
            forwarded=True,
            query=query,
        )
        req.shown = {
            "request_url": with_query(url, query),
            "request_headers": masked_headers(headers.iteritems(), config.get("headers", {})),
        }
        return req


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
