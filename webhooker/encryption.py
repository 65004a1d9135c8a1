"""Secrets encrypted at rest: Fernet tokens under settings.ENCRYPTION_KEYS.

The first key encrypts; every key decrypts (cryptography's MultiFernet). Rotating
is: put a new key first, run `manage.py rotatekeys` (which re-encrypts every
stored secret under it), then drop the old key. A token no key opens — a key
removed too soon — reads back as an Unreadable value rather than raising, so one
bad row never takes down a list, the engine or the inbound path: whoever uses the
value checks for it and says so in words (see deliveries/fields.py).
"""

from __future__ import annotations

import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

# Every Fernet token begins with its version byte 0x80, which base64 writes "gA".
TOKEN_PREFIX = "gA"  # noqa: S105 (a format, not a secret)


class Unreadable(str):
    """A stored token none of the keys opens. Empty as text, it keeps the token:
    saving the row again writes the token back unchanged, so restoring the key
    still recovers the value."""

    token: str

    def __new__(cls, token: str):
        value = super().__new__(cls, "")
        value.token = token
        return value


class UnreadableDict(dict):
    """Unreadable, for a value that decrypts to a JSON object."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token


UNREADABLE = (Unreadable, UnreadableDict)
PROBLEM = (
    "cannot be decrypted with the keys in WEBHOOKER_ENCRYPTION_KEYS "
    "(was the key that encrypted it removed before `manage.py rotatekeys` ran?)"
)


@functools.cache
def _keys() -> tuple[MultiFernet, Fernet]:
    fernets = [Fernet(key) for key in settings.ENCRYPTION_KEYS]
    return MultiFernet(fernets), fernets[0]


@receiver(setting_changed)
def _forget_keys(*, setting, **kwargs):
    if setting == "ENCRYPTION_KEYS":
        _keys.cache_clear()


def encrypt(text: str) -> str:
    """`text` as a token under the first key."""
    return _keys()[0].encrypt(text.encode()).decode("ascii")


def decrypt(token: str) -> str:
    """The text of `token`; raises InvalidToken when no key opens it."""
    return _keys()[0].decrypt(token.encode()).decode()


def is_token(value: str) -> bool:
    """Whether a stored value has the shape of a token (not plain text stored
    before encryption, which the migration and rotatekeys encrypt)."""
    return value.startswith(TOKEN_PREFIX)


def is_current(token: str) -> bool:
    """Whether `token` is under the first key already (rotatekeys skips it)."""
    try:
        _keys()[1].decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def rotate(token: str) -> str:
    """`token` re-encrypted under the first key; raises InvalidToken as decrypt()."""
    return _keys()[0].rotate(token.encode()).decode("ascii")


def unreadable(*values) -> bool:
    """Whether any of `values` is a stored secret no key opens."""
    return any(isinstance(value, UNREADABLE) for value in values)


__all__ = ["PROBLEM", "InvalidToken", "Unreadable", "UnreadableDict", "decrypt", "encrypt"]
