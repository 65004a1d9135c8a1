"""Inbound verification presets, chosen by `Entrypoint.verification`.

Each preset checks a request the way its provider documents signing it, over the
raw body bytes, comparing in constant time, before anything is stored. A failure
raises Rejected, whose message is the short reason the 401 answers with: it names
what was wrong, never what was expected.

This registry is the one list of presets (Entrypoint.Verification's choices, the
entrypoint form's fields) and also says where each provider puts its event id,
the default source of deduplication. Like the target types, presets never import
deliveries.models, which imports them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import json
from collections.abc import Callable
from typing import ClassVar

from django.core.exceptions import ValidationError

from deliveries import signing

# header name -> value as received, or None when absent.
HeaderLookup = Callable[[str], str | None]

# Seconds a signed timestamp may be away from now (Stripe's, Slack's and Standard
# Webhooks' documented tolerance): older is a replay, newer a wrong clock.
TOLERANCE = 300

ALGORITHMS = ("sha1", "sha256", "sha512")
ENCODINGS = ("hex", "base64")

# Longest provider event id kept; a longer one is not an id anyone sends, and
# cutting it could make two different events look the same.
PROVIDER_ID_MAX = 255


_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


class Rejected(Exception):
    """The request failed verification; the view answers 401 with str(self) and
    stores nothing. `challenge` is a WWW-Authenticate value, if the scheme has one."""

    def __init__(self, reason: str, challenge: str | None = None):
        super().__init__(reason)
        self.challenge = challenge


class Preset:
    """One way of verifying a sender. Stateless; shared between threads."""

    name: ClassVar[str]
    label: ClassVar[str]
    # The config keys this preset uses; the entrypoint form shows their fields.
    keys: ClassVar[tuple[str, ...]] = ()
    # Keys whose values are secrets: masked in the admin, never shown again.
    secret_keys: ClassVar[tuple[str, ...]] = ()
    # Where the provider puts its event id ("header:Name" or "json:dotted.path").
    default_id_source: ClassVar[str] = ""

    # Keys that may be left out, and the value they then take.
    defaults: ClassVar[dict[str, str]] = {}

    @classmethod
    def clean_config(cls, config: dict) -> dict:
        """The normalised config, or ValidationError({key: message})."""
        cleaned, errors = {}, {}
        for key in cls.keys:
            value = config.get(key)
            if value in (None, "") and key in cls.defaults:
                value = cls.defaults[key]
            if not isinstance(value, str) or not (value or key in cls.defaults):
                errors[key] = f"{cls.label} needs a {key}."
            elif key == "header" and not set(value) <= _TOKEN_CHARS:
                errors[key] = f"{value[:100]!r} is not a header name."
            else:
                cleaned[key] = value
        unknown = set(config) - set(cls.keys)
        if unknown:
            errors["__all__"] = f"Unknown keys for {cls.label}: {', '.join(sorted(unknown))}."
        if errors:
            raise ValidationError(errors)
        return cleaned

    def verify(self, config: dict, header: HeaderLookup, body: bytes, now: float) -> None:
        raise NotImplementedError


class NoVerification(Preset):
    name = "none"
    label = "None (anyone holding the URL)"

    def verify(self, config, header, body, now):
        return None


def _required(header: HeaderLookup, name: str) -> str:
    value = header(name)
    if not value:
        raise Rejected(f"missing {name} header")
    return value


# Senders built on Svix send the Standard Webhooks headers under these names.
SVIX_NAMES = {
    "webhook-id": "svix-id",
    "webhook-timestamp": "svix-timestamp",
    "webhook-signature": "svix-signature",
}


def _either(header: HeaderLookup, name: str) -> str:
    """A Standard Webhooks header under its own name or Svix's."""
    value = header(name) or header(SVIX_NAMES[name])
    if not value:
        raise Rejected(f"missing {name} (or {SVIX_NAMES[name]}) header")
    return value


def _same(received: str, expected: str) -> bool:
    # Header values arrive as latin-1 text; compare_digest wants bytes for anything
    # that is not ASCII.
    return hmac.compare_digest(received.encode("utf-8", "replace"), expected.encode())


def _mac(secret: str, data: bytes, algorithm: str = "sha256") -> bytes:
    return hmac.digest(secret.encode(), data, algorithm)


def _timestamp(value: str, now: float) -> int:
    try:
        timestamp = int(value.strip())
    except ValueError:
        raise Rejected("malformed timestamp") from None
    if abs(now - timestamp) > TOLERANCE:
        raise Rejected("timestamp outside the 5 minute tolerance")
    return timestamp


def _expect(candidates: list[str], expected: str) -> None:
    # Every candidate compared: which one matched says nothing worth timing.
    if not any([_same(candidate, expected) for candidate in candidates]):
        raise Rejected("signature mismatch")


class OneSecret(Preset):
    """A preset configured with the one secret its provider shares: {"secret": "..."}."""

    keys = ("secret",)
    secret_keys = keys


class GitHub(OneSecret):
    name = "github"
    label = "GitHub"
    default_id_source = "header:X-GitHub-Delivery"

    def verify(self, config, header, body, now):
        received = _required(header, "X-Hub-Signature-256")
        _expect([received], "sha256=" + _mac(config["secret"], body).hex())


class Stripe(OneSecret):
    name = "stripe"
    label = "Stripe"
    default_id_source = "json:id"

    def verify(self, config, header, body, now):
        received = _required(header, "Stripe-Signature")
        timestamp, candidates = None, []
        for item in received.split(","):
            key, _, value = item.strip().partition("=")
            if key == "t" and timestamp is None:
                timestamp = value
            elif key == "v1":
                candidates.append(value)
        if timestamp is None or not candidates:
            raise Rejected("malformed Stripe-Signature header")
        _timestamp(timestamp, now)
        # Stripe sends one v1 per active secret while one is being rolled.
        _expect(candidates, _mac(config["secret"], timestamp.encode() + b"." + body).hex())


class Shopify(OneSecret):
    name = "shopify"
    label = "Shopify"
    default_id_source = "header:X-Shopify-Webhook-Id"

    def verify(self, config, header, body, now):
        received = _required(header, "X-Shopify-Hmac-Sha256")
        _expect([received], base64.b64encode(_mac(config["secret"], body)).decode())


class Slack(OneSecret):
    name = "slack"
    label = "Slack"
    # The Events API's id, the same on each of Slack's retries.
    default_id_source = "json:event_id"

    def verify(self, config, header, body, now):
        received = _required(header, "X-Slack-Signature")
        timestamp = _required(header, "X-Slack-Request-Timestamp")
        _timestamp(timestamp, now)
        signed = b"v0:" + timestamp.encode() + b":" + body
        _expect([received], "v0=" + _mac(config["secret"], signed).hex())


class StandardWebhooks(OneSecret):
    name = "standard_webhooks"
    label = "Standard Webhooks"
    default_id_source = "header:webhook-id"

    @classmethod
    def clean_config(cls, config):
        cleaned = super().clean_config(config)
        try:
            signing.secret_key(cleaned["secret"])
        except ValueError as exc:
            raise ValidationError({"secret": f"Not a Standard Webhooks secret: {exc}."}) from None
        return cleaned

    def verify(self, config, header, body, now):
        msg_id = _either(header, "webhook-id")
        timestamp = _timestamp(_either(header, "webhook-timestamp"), now)
        received = _either(header, "webhook-signature")
        expected = signing.signature(signing.secret_key(config["secret"]), msg_id, timestamp, body)
        # Space-separated: a sender rotating its secret signs with both.
        _expect(received.split(), expected)


class GenericHmac(Preset):
    name = "hmac"
    label = "HMAC of the body (generic)"
    keys = ("secret", "header", "algorithm", "encoding", "prefix")
    secret_keys = ("secret",)
    defaults = {"algorithm": "sha256", "encoding": "hex", "prefix": ""}

    @classmethod
    def clean_config(cls, config):
        cleaned = super().clean_config(config)
        errors = {}
        if cleaned["algorithm"] not in ALGORITHMS:
            errors["algorithm"] = f"The algorithm is one of {', '.join(ALGORITHMS)}."
        if cleaned["encoding"] not in ENCODINGS:
            errors["encoding"] = f"The encoding is one of {', '.join(ENCODINGS)}."
        if errors:
            raise ValidationError(errors)
        return cleaned

    def verify(self, config, header, body, now):
        name = config["header"]
        received = _required(header, name)
        prefix = config["prefix"]
        if not received.startswith(prefix):
            raise Rejected(f"{name} lacks its prefix")
        received = received[len(prefix) :]
        digest = _mac(config["secret"], body, config["algorithm"])
        if config["encoding"] == "hex":
            expected, received = digest.hex(), received.lower()
        else:
            expected = base64.b64encode(digest).decode()
        _expect([received], expected)


class BasicAuth(Preset):
    name = "basic"
    label = "HTTP Basic auth"
    keys = ("username", "password")
    secret_keys = ("password",)
    CHALLENGE = 'Basic realm="webhooker", charset="UTF-8"'

    @classmethod
    def clean_config(cls, config):
        cleaned = super().clean_config(config)
        if ":" in cleaned["username"]:
            raise ValidationError({"username": "A Basic auth username cannot contain ':'."})
        return cleaned

    def verify(self, config, header, body, now):
        received = header("Authorization")
        if not received:
            raise Rejected("missing Authorization header", self.CHALLENGE)
        scheme, _, encoded = received.partition(" ")
        try:
            if scheme.lower() != "basic":
                raise ValueError
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise Rejected("malformed Authorization header", self.CHALLENGE) from None
        username, sep, password = decoded.partition(b":")
        # Both compared whatever the first says, so the time taken tells nothing.
        user_ok = hmac.compare_digest(username, config["username"].encode())
        password_ok = hmac.compare_digest(password, config["password"].encode())
        if not (sep and user_ok and password_ok):
            raise Rejected("wrong credentials", self.CHALLENGE)


class TokenHeader(Preset):
    name = "token"
    label = "Token in a header"
    keys = ("header", "secret")
    secret_keys = ("secret",)

    def verify(self, config, header, body, now):
        name = config["header"]
        if not _same(_required(header, name), config["secret"]):
            raise Rejected(f"wrong {name}")


PRESETS: dict[str, Preset] = {
    preset.name: preset()
    for preset in (
        NoVerification,
        GitHub,
        Stripe,
        Shopify,
        Slack,
        StandardWebhooks,
        GenericHmac,
        BasicAuth,
        TokenHeader,
    )
}


def choices() -> list[tuple[str, str]]:
    return [(name, preset.label) for name, preset in PRESETS.items()]


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValidationError(f"Unknown verification {name!r}.") from None


def clean_config(name: str, config) -> dict:
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValidationError("The verification config must be a JSON object.")
    return get_preset(name).clean_config(config)


def check(name: str, config: dict, header: HeaderLookup, body: bytes, now: float) -> None:
    """Verify a request with the preset `name`; raise Rejected when it fails.

    A config the preset cannot use (written past the admin's validation) rejects
    every request rather than letting one through unchecked.
    """
    try:
        PRESETS[name].verify(config, header, body, now)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise Rejected("this entrypoint's verification is misconfigured") from None


# --- provider event ids --------------------------------------------------------


def clean_id_source(source: str) -> str:
    """`header:Name` or `json:dotted.path`, or blank for the preset's default."""
    source = (source or "").strip()
    if not source:
        return ""
    kind, _, where = source.partition(":")
    kind, where = kind.strip().lower(), where.strip()
    if kind not in ("header", "json") or not where:
        raise ValidationError(
            "Write header:Name (e.g. header:X-Request-Id) or json:path (e.g. json:data.id)."
        )
    if kind == "json" and "" in where.split("."):
        raise ValidationError("A JSON path is names separated by single dots, e.g. data.id.")
    return f"{kind}:{where}"


def id_source(verification: str, dedup_source: str) -> str:
    """Where this entrypoint's provider event ids are: its own setting, else its
    preset's default ("" when neither says)."""
    preset = PRESETS.get(verification)
    return dedup_source or (preset.default_id_source if preset else "")


def provider_id(source: str, header: HeaderLookup, body: bytes) -> str:
    """The provider's event id from a header or the JSON body; "" when absent."""
    kind, _, where = source.partition(":")
    if kind == "header":
        value = header(where)
        if not value and where.lower() in SVIX_NAMES:
            value = header(SVIX_NAMES[where.lower()])
    elif kind == "json":
        value = _json_path(body, where)
    else:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return ""
    return _provider_value(str(value))


def _provider_value(value: str) -> str:
    """An id as stored: trimmed, NUL replaced, "" when longer than the column."""
    value = value.strip().replace("\x00", "\ufffd")
    return value if len(value) <= PROVIDER_ID_MAX else ""


def _json_path(body: bytes, path: str):
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    for name in path.split("."):
        if isinstance(value, list) and name.isascii() and name.isdigit():
            # A list's element by its index (SendGrid posts a list of events).
            index = int(name)
            value = value[index] if index < len(value) else None
        elif isinstance(value, dict):
            value = value.get(name)
        else:
            return None
    return value


# --- what a sender says of its event -------------------------------------------

# Headers that name the kind of event, as senders send them (GitHub, GitLab,
# Bitbucket, Shopify, Gitea, Twilio-style); else a JSON body's "type" (Stripe,
# Standard Webhooks) or "event".
EVENT_TYPE_HEADERS = (
    "x-github-event",
    "x-gitlab-event",
    "x-event-key",
    "x-shopify-topic",
    "x-gitea-event",
    "x-event-type",
)
# Headers that carry the sender's own id of the event, whatever the entrypoint's
# preset: Standard Webhooks and Svix, GitHub, GitLab, Shopify. Else a JSON body's
# Stripe "id" (evt_...) or Slack "event_id".
EVENT_ID_HEADERS = (
    "webhook-id",
    "svix-id",
    "x-github-delivery",
    "x-gitlab-event-uuid",
    "x-shopify-webhook-id",
    "x-shopify-event-id",
)
# Bodies parsed only up to this size: the list's columns are a convenience, never
# worth parsing megabytes in the inbound request.
EVENT_TYPE_BODY_LIMIT = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SenderSays:
    """What the sender's request says of its event ("" where it says nothing)."""

    event_type: str = ""
    event_id: str = ""


def sender_says(headers: list[list[str]], body: bytes) -> SenderSays:
    """The event's type and the sender's id for it, from the well-known headers,
    else from a small JSON body (parsed once for both)."""
    kind = event_id = ""
    for name, value in headers:
        lower = name.lower()
        if not kind and lower in EVENT_TYPE_HEADERS and value.strip():
            kind = value.strip()[:200]
        elif not event_id and lower in EVENT_ID_HEADERS and value.strip():
            event_id = _provider_value(value)
    if (kind and event_id) or len(body) > EVENT_TYPE_BODY_LIMIT or body.lstrip()[:1] != b"{":
        return SenderSays(kind, event_id)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return SenderSays(kind, event_id)
    if not isinstance(document, dict):
        return SenderSays(kind, event_id)
    for key in ("type", "event", "event_type"):
        value = document.get(key)
        if not kind and isinstance(value, str) and value.strip():
            kind = value.strip()[:200]
    if not event_id:
        stripe, slack = document.get("id"), document.get("event_id")
        if isinstance(stripe, str) and stripe.startswith("evt_"):
            event_id = _provider_value(stripe)
        elif isinstance(slack, str):
            event_id = _provider_value(slack)
    return SenderSays(kind, event_id)
