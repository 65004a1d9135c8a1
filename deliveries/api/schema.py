from drf_spectacular.openapi import AutoSchema

from deliveries.api.errors import ErrorSerializer


class ApiSchema(AutoSchema):
    """Documents each list's query parameters (its view's list_filter) and the error
    answers every operation can give, in the one error shape."""

    def get_override_parameters(self):
        parameters = super().get_override_parameters()
        list_filter = getattr(self.view, "list_filter", None)
        if list_filter is not None and self._is_list_view():
            parameters = [*parameters, list_filter]
        return parameters

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    ErrorSerializer, code, direction=direction
                )
        return responses

    def _error_codes(self) -> list[str]:
        codes = []
        listing = self._is_list_view()
        if self.method in ("POST", "PUT", "PATCH") or listing:
            codes.append("400")  # invalid body, or invalid query parameters
        if self.view.authentication_classes:
            codes += ["401", "429"]
        if "{" in self.path or listing:
            codes.append("404")  # not yours or not there; for lists, a stale cursor
        return codes
