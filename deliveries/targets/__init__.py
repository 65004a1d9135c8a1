"""Target types, one module each, chosen by `Target.type`
(docs/architecture.md, Targets).

This registry is the one list of types: Target.Type and its choices, the target
form's fields and the admin's fieldsets are all built from it.
"""

from django.core.exceptions import ValidationError

from deliveries.targets.base import (
    RESPONSE_BODY_LIMIT,
    Outcome,
    TargetType,
    config_fields,
    require_mapping,
    shown_by,
)
from deliveries.targets.database import DatabaseTarget
from deliveries.targets.http import HttpTarget
from deliveries.targets.log import LogTarget
from deliveries.targets.slack import SlackTarget

TARGET_TYPES: dict[str, TargetType] = {
    kind.type: kind() for kind in (HttpTarget, DatabaseTarget, LogTarget, SlackTarget)
}


def choices() -> list[tuple[str, str]]:
    """(type, label) of every target type, in the registry's order."""
    return [(type_, kind.label) for type_, kind in TARGET_TYPES.items()]


def shown_config(config: dict) -> dict:
    """A config of whichever type as it is shown once saved (config keys are unique
    across types: each type's fields show their own)."""
    fields = {}
    for kind in TARGET_TYPES.values():
        fields.update(config_fields(type(kind)))
    return shown_by(fields, config)


def get_target_type(type_: str) -> TargetType:
    try:
        return TARGET_TYPES[type_]
    except KeyError:
        raise ValidationError(f"Unknown target type {type_!r}.") from None


def clean_config(type_: str, config, *, stored: dict | None = None) -> dict:
    """`config` checked against its type (`stored`: as saved already, if it was)."""
    return get_target_type(type_).clean_config(require_mapping(config), stored=stored)


__all__ = [
    "RESPONSE_BODY_LIMIT",
    "TARGET_TYPES",
    "Outcome",
    "TargetType",
    "choices",
    "clean_config",
    "get_target_type",
]
