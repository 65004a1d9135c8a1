"""The interface every target type implements (docs/architecture.md, Targets).

Target types never import deliveries.models nor touch the database: the engine
hands them a Task and the event's body, and they answer with an Outcome. That
keeps the models free to import the registry (Target.Type, config validation).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from django import forms
from django.core.exceptions import ValidationError

from deliveries import ssrf
from webhooker import encryption

if TYPE_CHECKING:
    from deliveries.engine.task import Task

# How much of a receiver's answer is read and stored with each attempt: of its
# body, and of its header lines.
RESPONSE_BODY_LIMIT = 4096
RESPONSE_HEADERS_LIMIT = 4096
# Shown in place of a credential on the delivery page and in the target form.
MASK = "••••••••"
# Header names whose values are credentials whoever sets them.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token"}
)


# Whose fault a failed attempt was, and of what kind: (class, fault, words). The
# receiver's are what it answered or failed to; ours are webhooker's side (an address
# the guard refused, a transform, a configuration, a bug). DeliveryResult.failure and
# Delivery.failure hold the class.
FAILURES = (
    ("status", "receiver", "answered an error status"),
    ("timeout", "receiver", "timed out"),
    ("connection", "receiver", "connection failed"),
    ("dns", "receiver", "DNS name not found"),
    ("tls", "receiver", "TLS failed"),
    ("answer", "receiver", "answer not valid HTTP"),
    ("blocked", "ours", "address blocked by the guard"),
    ("transform", "ours", "transform failed"),
    ("config", "ours", "configuration error"),
    ("internal", "ours", "internal error"),
)
FAULTS = {"receiver": "the receiver's", "ours": "webhooker's"}


def whose_fault(failure: str) -> str:
    """A failure class in words, whose fault first: "the receiver's fault: timed out"."""
    for name, whose, words in FAILURES:
        if name == failure:
            return f"{FAULTS[whose]} fault: {words}"
    return "cause unknown"


def failures_of(fault: str) -> list[str]:
    """The failure classes that are `fault`'s ("receiver" or "ours")."""
    return [name for name, whose, _ in FAILURES if whose == fault]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt came to.

    `retry_after` is the receiver's own wish (a Retry-After header) in seconds;
    `permanent` means no retry can help (410 Gone, a refused address).
    """

    success: bool
    status_code: int | None = None
    response_body: str = ""
    error: str = ""
    retry_after: float | None = None
    permanent: bool = False
    # What was sent, for the delivery page: the URL and the header lines, with
    # credentials already masked (masked_headers).
    request_url: str = ""
    request_headers: tuple = ()
    # The answer's header lines as text, at most RESPONSE_HEADERS_LIMIT characters.
    response_headers: str = ""
    # Nothing was sent after all (transport.HELD_BACK): no attempt to count.
    held_back: bool = False
    # A failed attempt's class (FAILURES), "" for a success.
    failure: str = ""


class TargetType:
    """One kind of target. Subclasses are stateless and shared between threads."""

    type: ClassVar[str]
    # The name people choose it by (Target.type's choices).
    label: ClassVar[str]
    # Whether max_retries, backoff and the circuit breaker apply to this kind.
    retries: ClassVar[bool] = False
    # The form field that shows what clean_config() says is wrong with the config.
    main_field: ClassVar[str | None] = None

    @classmethod
    def clean_config(cls, config: dict, *, stored: dict | None = None) -> dict:
        """Return the normalised config, or raise ValidationError with messages.
        `stored`: the config as saved already (what was checked when it was given
        need not be checked again), None for a new target."""
        return {}

    @classmethod
    def form_fields(cls) -> dict[str, forms.Field]:
        """New form fields, one per config key, for the target form.

        The form holds the fields of every type at once, so names are unique across
        types; a field marked required is required only when its type is chosen.
        """
        return {}

    def deliver(self, task: Task, body: bytes) -> Outcome:
        """Deliver on the calling thread (transport.SendsHTTP: wait for request())."""
        raise NotImplementedError

    @classmethod
    def shown_config(cls, config: dict) -> dict:
        """The config as the console and the API show it once saved: what each of
        its form fields shows of a stored value (`shown()`: secrets masked). Sent
        back as shown, each masked value keeps the stored one (keep_secrets)."""
        return shown_by(config_fields(cls), config)

    def request(self, task: Task, body: bytes):
        """The HTTP request (transport.Request) that delivers `body`, which the
        engine sends on the HTTP client's loop with thousands in flight; None for a
        kind that delivers by itself (deliver())."""
        return None


# One DNS label; a host is one or more of them. Single labels ("receiver", a
# Compose service) are hosts too: the SSRF check decides where they may lead.
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)\Z", re.IGNORECASE)


def url_problem(value: str) -> str | None:
    """What is wrong with `value` as a target URL, or None. Only http(s) with an
    explicit scheme: a URL typed without one is asked for it, never guessed."""
    if "://" not in value:
        return "Start the URL with http:// or https://."
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return "Enter a valid URL."
    if parts.scheme.lower() not in ("http", "https"):
        return "Only http:// and https:// URLs can be targets."
    host = parts.hostname or ""
    if not host or any(c.isspace() for c in value):
        return "Enter a valid URL."
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        return "Enter a valid URL."
    return None


def require_url(config: dict, key: str) -> str:
    value = config.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"'{key}' is required: an absolute http(s) URL.")
    value = value.strip()
    if url_problem(value):
        raise ValidationError(
            f"'{key}' must be an absolute http:// or https:// URL, not {value[:200]!r}."
        )
    try:
        ssrf.check_url(value)
    except ValueError as exc:
        raise ValidationError(f"'{key}': {exc}.") from None
    return value


def mask_url(url, *, path=False) -> str:
    """`url` as shown once saved: a password in it masked, and with `path` its path
    and query after the first segment too (a Slack webhook URL's path is its secret:
    https://hooks.slack.com/services/••••••••)."""
    if not isinstance(url, str) or not url:
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        # A password masked; a user name alone is often a token (https://ghp_…@host).
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0] if parts.password is not None else MASK
        netloc = f"{user}:{MASK}@{host}" if parts.password is not None else f"{user}@{host}"
    rest = (parts.path, parts.query, parts.fragment)
    segments = parts.path.strip("/").split("/")
    if path and (segments != [""] or parts.query):
        rest = (f"/{segments[0]}/{MASK}" if len(segments) > 1 else f"/{MASK}", "", "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, *rest))


def keep_masked(value, shown, stored):
    """`value` sent back with what was shown of `stored` left as it was: the stored
    value in place of its mask, key by key in objects (a header's value). A stored
    value no key decrypts stays as it is when sent back empty or masked."""
    if isinstance(stored, encryption.UNREADABLE) and value in (None, "", MASK, {}):
        return stored
    if isinstance(value, dict) and isinstance(shown, dict) and isinstance(stored, dict):
        return {
            key: keep_masked(item, shown.get(key), stored.get(key)) if key in stored else item
            for key, item in value.items()
        }
    return stored if shown is not None and value == shown and value != stored else value


# The config keys that say where requests (and the credentials with them) go.
DESTINATIONS = ("url", "webhook_url", "oauth_token_url", "proxy")


def _where(url) -> tuple | None:
    if not isinstance(url, str) or not url:
        return None
    parts = urllib.parse.urlsplit(url)
    try:
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return parts.scheme.lower(), parts.netloc.lower(), None


def keep_secrets(value: dict, shown: dict, stored: dict) -> dict:
    """A config sent back: masked values take their stored values again only while
    it goes where it went (the same scheme, host and port of its URL, token URL and
    proxy) — else a stored credential would follow a changed host; and a mask left
    where no stored value stands (a new header, a changed URL's password) is refused,
    never sent as a value. ValidationError in words."""
    kept = keep_masked(value, shown, stored)
    if kept != value and isinstance(stored, dict):
        moved = [k for k in DESTINATIONS if _where(kept.get(k)) != _where(stored.get(k))]
        if moved:
            raise ValidationError(
                f"The {', '.join(moved)} changed: type the secrets again (a stored "
                "secret is only kept for the destination it was given for)."
            )
    left = masked_keys(kept)
    if left:
        raise ValidationError(
            f"Type the value of {', '.join(left)} itself: {MASK} stands for a stored "
            "value, and there is none for it here."
        )
    return kept


def masked_keys(config, prefix="") -> list[str]:
    found = []
    if isinstance(config, dict) and not isinstance(config, encryption.UNREADABLE):
        for key, item in config.items():
            if isinstance(item, dict):
                found += masked_keys(item, f"{prefix}{key}.")
            elif isinstance(item, str) and MASK in item:
                found.append(f"{prefix}{key}")
    return found


class TargetURLField(forms.CharField):
    """A target URL in the form: http(s), its scheme typed out, any host name the
    SSRF rules allow (a CharField: URLField would add https:// by itself and refuse
    single-label hosts). Its form shows a stored URL with its secrets masked (shown();
    `path` for a URL whose path is the secret); sent back unchanged, it keeps the
    stored one (keep_masked)."""

    widget = forms.URLInput(attrs={"size": 60})

    def __init__(self, *, secret_path=False, **kwargs):
        self.secret_path = secret_path
        super().__init__(**kwargs)

    def shown(self, stored):
        """What the form shows of a stored URL (its initial; never bound data)."""
        return mask_url(stored, path=self.secret_path)

    def keep_masked(self, value, stored):
        kept = keep_masked(value, self.shown(stored), stored)
        if isinstance(kept, str) and MASK in kept:
            raise ValidationError(f"Type the URL itself: {MASK} stands for a stored value.")
        return kept

    def validate(self, value):
        super().validate(value)
        problem = value and url_problem(value)
        if problem:
            raise ValidationError(problem, code="invalid")


class SecretField(forms.CharField):
    """A credential in the target form: once saved, shown as MASK; sent back so, the
    stored value stays (keep_secrets). Empty removes it."""

    def shown(self, stored):
        return MASK if stored else stored


_CONFIG_FIELDS: dict[type, dict] = {}


def config_fields(kind) -> dict[str, forms.Field]:
    """A target type's config form fields, made once (shown_config reads them)."""
    if kind not in _CONFIG_FIELDS:
        _CONFIG_FIELDS[kind] = kind.form_fields()
    return _CONFIG_FIELDS[kind]


def shown_by(fields: dict, config: dict) -> dict:
    """`config` as `fields` show its stored values (a field's `shown()`; the rest as
    they are)."""
    return {
        key: fields[key].shown(value) if hasattr(fields.get(key), "shown") else value
        for key, value in config.items()
    }


def masked_headers(lines, secret_names=()) -> tuple:
    """(name, value) pairs with the value of every credential masked: the names in
    `secret_names` (a target's own configured headers) and CREDENTIAL_HEADERS."""
    secret = CREDENTIAL_HEADERS | {name.lower() for name in secret_names}
    return tuple((name, MASK if name.lower() in secret else value) for name, value in lines)


def require_mapping(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("The config must be a JSON object.")
    return value
