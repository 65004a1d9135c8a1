"""Standard Webhooks signatures: what http targets send, and what the
standard_webhooks inbound preset checks (https://www.standardwebhooks.com/).

Signed with the standard library rather than the `standardwebhooks` package (which
the tests use to verify): the package signs only text, where an event's body is
whatever bytes the sender posted (and it is the slower of the two: bench/RESULTS.md).
"""

import base64
import binascii
import datetime
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def new_secret() -> str:
    """A fresh secret in the format the spec recommends: whsec_ + base64 of 32 bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a whsec_ secret stands for; ValueError when it is not one."""
    encoded = secret.removeprefix(PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64 after the whsec_ prefix") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("the key must be 24 to 64 bytes")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, over the exact bytes sent."""
    signed = b"".join((msg_id.encode(), b".", str(timestamp).encode(), b".", body))
    return "v1," + base64.b64encode(hmac.digest(key, signed, hashlib.sha256)).decode()


def message_id(event_code, target_id: int) -> str:
    """The webhook-id of a delivery: the event's code and the target's id, so every
    attempt of the delivery, retries and redeliveries alike, carries the same one."""
    return f"msg_{event_code.hex}_{target_id}"


def valid_secrets(
    current: str,
    previous: str,
    rotated_at: datetime.datetime | None,
    now: datetime.datetime,
    overlap: float,
) -> list[str]:
    """The secrets to sign with: the current one, and the one it replaced while the
    rotation is younger than `overlap` seconds, so receivers can switch over."""
    valid = [current] if current else []
    if previous and rotated_at is not None and (now - rotated_at).total_seconds() < overlap:
        valid.append(previous)
    return valid


def headers(secrets_: list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers, one signature per secret, space-separated."""
    signatures = " ".join(signature(secret_key(s), msg_id, timestamp, body) for s in secrets_)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def mask(secret: str) -> str:
    """What the admin shows of a secret until asked: its kind and last four characters."""
    if not secret:
        return ""
    prefix = PREFIX if secret.startswith(PREFIX) else ""
    return f"{prefix}{'•' * 8}{secret[-4:]}"
