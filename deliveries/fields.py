"""Model fields whose values are stored encrypted (webhooker/encryption.py).

A stored value is a Fernet token in a text column; Python code sees the plain
value. Tokens differ every time the same value is encrypted, so these columns are
never looked up by value (the one exception, "", is stored as itself: an empty
secret says no more than the empty column would). A token no key opens reads back
as an encryption.Unreadable value, and is written back unchanged when the row is
saved again. Serialized (dumpdata) values are the tokens, so a dump holds no
secret either; loading one (a raw save) reads the tokens back (open_loaded_tokens).
Only then: a token sent through a form or the API is a value like any other, never
opened (it would let a leaked backup's secrets into a live row).
"""

from __future__ import annotations

import json

from django import forms
from django.apps import apps
from django.core import validators
from django.db import models

from webhooker import encryption


class EncryptedTextField(models.TextField):
    """Text stored encrypted."""

    def from_db_value(self, value, expression, connection):
        if not value:
            return value
        try:
            return self.from_text(encryption.decrypt(value))
        except encryption.InvalidToken:
            return self.unreadable(value)

    def from_text(self, text: str):
        return text

    def to_text(self, value) -> str:
        return value

    def unreadable(self, token: str):
        return encryption.Unreadable(token)

    def get_prep_value(self, value):
        if isinstance(value, encryption.UNREADABLE):
            return value.token
        value = super().get_prep_value(value)  # to_python: a JSON field's value as it is
        if value is None or value == "":
            return value
        return encryption.encrypt(self.to_text(value))

    def value_to_string(self, obj):
        return self.get_prep_value(self.value_from_object(obj))


class EncryptedURLField(EncryptedTextField):
    """A URL (credentials, tokens in its path) stored encrypted."""

    default_validators = [validators.URLValidator()]

    def formfield(self, **kwargs):
        if "form_class" not in kwargs:
            kwargs.update(form_class=forms.URLField, assume_scheme="https")
        return super().formfield(**kwargs)


class EncryptedJSONField(EncryptedTextField):
    """A JSON value stored encrypted, as its text."""

    def from_text(self, text: str):
        return json.loads(text)

    def to_text(self, value) -> str:
        return json.dumps(value, separators=(",", ":"))

    def unreadable(self, token: str):
        return encryption.UnreadableDict(token)

    def to_python(self, value):
        return value  # a JSON value as it is (TextField's would make it a str)

    def formfield(self, **kwargs):
        return super().formfield(**{"form_class": forms.JSONField, **kwargs})


def encrypted_fields():
    """(model, field) for every column stored encrypted, in every installed app."""
    return [
        (model, field)
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, EncryptedTextField)
    ]


def open_loaded_tokens(sender, instance, raw=False, **kwargs):
    """pre_save of a model with encrypted fields: a row loaded from a dump (`raw`,
    loaddata) holds the tokens the dump kept; their values take their place before
    the row is saved (and encrypted again)."""
    if not raw:
        return
    for field in sender._meta.concrete_fields:
        value = getattr(instance, field.attname, None)
        if (
            isinstance(field, EncryptedTextField)
            and isinstance(value, str)
            and not isinstance(value, encryption.UNREADABLE)
            and encryption.is_token(value)
        ):
            try:
                text = encryption.decrypt(value)
            except encryption.InvalidToken:
                setattr(instance, field.attname, field.unreadable(value))
            else:
                setattr(instance, field.attname, field.from_text(text))
