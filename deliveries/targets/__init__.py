"""Target types, one module each, chosen by `Target.type`
(docs/architecture.md, Targets).

This registry is the one list of types: Target.Type and its choices, the target
form's fields and the admin's fieldsets are all built from it.
"""

from django.core.exceptions import ValidationError

from deliveries.targets.base import RESPONSE_BODY_LIMIT, Outcome, TargetType, require_mapping
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


def get_target_type(type_: str) -> TargetType:
    try:
        return TARGET_TYPES[type_]
    except KeyError:
        raise ValidationError(f"Unknown target type {type_!r}.") from None


def clean_config(type_: str, config, *, known_certificate: str = "") -> dict:
    """`config` checked against its type; `known_certificate`, a client certificate
    saved already, whose dates are not checked again."""
    kind = get_target_type(type_)
    config = require_mapping(config)
    if kind.type == "http":
        return kind.clean_config(config, known_certificate=known_certificate)
    return kind.clean_config(config)


__all__ = [
    "RESPONSE_BODY_LIMIT",
    "TARGET_TYPES",
    "Outcome",
    "TargetType",
    "choices",
    "clean_config",
    "get_target_type",
]
