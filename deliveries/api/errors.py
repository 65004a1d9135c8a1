"""One shape for every error the API answers: {"error": "...", "fields": {...}}."""

from rest_framework import exceptions, serializers, status
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="What went wrong, in one sentence.")
    fields = serializers.DictField(
        child=serializers.JSONField(),
        help_text="Per request field (body or query parameter), its messages; "
        "empty unless the input was invalid.",
    )


class StateConflict(exceptions.APIException):
    """The object's state does not allow what was asked (a cancelled job resumed)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object's state does not allow this."


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a bug: Django's 500
    detail = response.data
    fields = {}
    if isinstance(exc, exceptions.ValidationError):
        if isinstance(detail, dict):
            fields = dict(detail)
            general = fields.pop(api_settings.NON_FIELD_ERRORS_KEY, [])
        else:
            general = detail
        error = " ".join(str(message) for message in general) or "Invalid input."
    elif isinstance(detail, dict) and "detail" in detail:
        error = str(detail["detail"])
    else:
        error = str(detail)
    response.data = {"error": error, "fields": fields}
    return response
