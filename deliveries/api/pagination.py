from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination


class NewestFirst(CursorPagination):
    """Cursor pages, newest first: each page is one index range on the primary key
    however deep it is, and rows arriving meanwhile never shift a page."""

    ordering = "-id"
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000

    def get_page_size(self, request):
        """`limit`, a whole number from 1 (above the most, the most); anything else
        is a 400, never the default in silence."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if size < 1:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number from 1 to {self.max_page_size}."]}
            )
        return min(size, self.max_page_size)

    def decode_cursor(self, request):
        # `cursor=` sent empty is a mistake, as any parameter sent empty is.
        if request.query_params.get(self.cursor_query_param) == "":
            raise ValidationError({self.cursor_query_param: ["Sent empty: leave it out."]})
        return super().decode_cursor(request)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                # No maximum: more than the most is answered with the most.
                parameter["schema"] = {"type": "integer", "minimum": 1}
                parameter["description"] = (
                    f"Rows per page, from 1 ({self.page_size} when left out; above "
                    f"{self.max_page_size}, {self.max_page_size})."
                )
            elif parameter["name"] == self.cursor_query_param:
                parameter["schema"] = {"type": "string", "minLength": 1}
        return parameters
