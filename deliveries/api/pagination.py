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
