from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

from deliveries.api.errors import ErrorSerializer

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x21-\\x7e]+$"},
    OpenApiParameter.HEADER,
    description="Send a POST again with the same key (and the same body) within 24 h to "
    "get its first answer again, with no second effect; the same key with another "
    "request answers 422 (deliveries/api/idempotency.py).",
)


class ApiSchema(AutoSchema):
    """Documents each list's query parameters (its view's list_filter) and the error
    answers every operation can give, in the one error shape."""

    def get_override_parameters(self):
        parameters = super().get_override_parameters()
        list_filter = getattr(self.view, "list_filter", None)
        if list_filter is not None and self._is_list_view():
            parameters = [*parameters, list_filter]
        if self.method == "POST":
            parameters = [*parameters, IDEMPOTENCY_KEY]
        return parameters

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    ErrorSerializer, code, direction=direction
                )
        return responses

    def _is_export(self) -> bool:
        return getattr(self.view, "action", None) == "export"

    def _error_codes(self) -> list[str]:
        codes = []
        listing = self._is_list_view()
        if self.method in ("POST", "PUT", "PATCH") or listing or self._is_export():
            codes.append("400")  # invalid body, or invalid query parameters
        if self.view.authentication_classes:
            codes += ["401", "429"]
        if "{" in self.path or listing:
            codes.append("404")  # not yours or not there; for lists, a stale cursor
        if self.method == "POST":
            codes += ["409", "422"]  # Idempotency-Key: still being answered; reused
        return codes


NO_NUL = "^[^\\u0000]*$"


def closed_request_bodies(result, generator, request, public):
    """drf-spectacular postprocessing hook: request bodies admit no other keys (the
    API answers an unknown key with 400, deliveries/api/strict.py)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if (name.endswith("Request") or name.startswith("Patched")) and "properties" in component:
            component["additionalProperties"] = False
            for field in component["properties"].values():
                # Text fields refuse NUL (DRF's ProhibitNullCharactersValidator).
                if field.get("type") == "string" and not (
                    {"format", "enum", "pattern"} & field.keys()
                ):
                    field["pattern"] = NO_NUL
    # A bulk action names what it acts on: a body, and something in it.
    for path in ("/api/v1/deliveries/redeliver/", "/api/v1/events/replay/"):
        body = result["paths"].get(path, {}).get("post", {}).get("requestBody")
        if body is not None:
            body["required"] = True
            for media in body.get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                component = result["components"]["schemas"].get(ref.rsplit("/", 1)[-1])
                if component is not None:
                    component["minProperties"] = 1
    return result
