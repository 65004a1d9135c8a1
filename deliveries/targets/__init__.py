"""Target types, one module each, chosen by `Target.type` (DESIGN §4)."""

from django.core.exceptions import ValidationError

from deliveries.targets.base import Outcome, TargetType
from deliveries.targets.database import DatabaseTarget
from deliveries.targets.http import HttpTarget
from deliveries.targets.log import LogTarget
from deliveries.targets.slack import SlackTarget

TARGET_TYPES: dict[str, TargetType] = {
    kind.type: kind() for kind in (HttpTarget, DatabaseTarget, LogTarget, SlackTarget)
}


def get_target_type(type_: str) -> TargetType:
    try:
        return TARGET_TYPES[type_]
    except KeyError:
        raise ValidationError(f"Unknown target type {type_!r}.") from None


def clean_config(type_: str, config) -> dict:
    from deliveries.targets.base import require_mapping

    return get_target_type(type_).clean_config(require_mapping(config))


__all__ = ["TARGET_TYPES", "Outcome", "TargetType", "clean_config", "get_target_type"]
