"""The interface every target type implements (DESIGN §4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from deliveries import ssrf

if TYPE_CHECKING:
    from deliveries.engine.task import Task


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


class TargetType:
    """One kind of target. Subclasses are stateless and shared between threads."""

    type: ClassVar[str]
    # Whether max_retries, backoff and the circuit breaker apply to this kind.
    retries: ClassVar[bool] = False

    @classmethod
    def clean_config(cls, config: dict) -> dict:
        """Return the normalised config, or raise ValidationError with messages."""
        return {}

    def deliver(self, task: Task) -> Outcome:
        raise NotImplementedError


_url = URLValidator(schemes=["http", "https"])


def require_url(config: dict, key: str) -> str:
    value = config.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"'{key}' is required: an absolute http(s) URL.")
    value = value.strip()
    try:
        _url(value)
    except ValidationError:
        raise ValidationError(
            f"'{key}' must be an absolute http:// or https:// URL, not {value[:200]!r}."
        ) from None
    try:
        ssrf.check_url(value)
    except ValueError as exc:
        raise ValidationError(f"'{key}': {exc}.") from None
    return value


def require_mapping(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("The config must be a JSON object.")
    return value
