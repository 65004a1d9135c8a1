from rest_framework.pagination import CursorPagination


class NewestFirst(CursorPagination):
    """Cursor pages, newest first: each page is one index range on the primary key
    however deep it is, and rows arriving meanwhile never shift a page."""

    ordering = "-id"
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000
