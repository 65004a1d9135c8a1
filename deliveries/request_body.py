"""Reading a request body under a byte limit, without holding more than the limit."""

CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    """The body is over the limit; the view answers 413."""


class BodyMalformed(Exception):
    """A Content-Length that is not a length, or fewer bytes than it promised: 400."""


def read_body(request, limit: int) -> bytes:
    """Return the raw body, reading at most `limit` + 1 bytes from the client.

    A declared Content-Length over the limit is refused before anything is read.
    Without one (chunked transfer), the body is read up to one byte past the limit,
    which is how an oversized stream is told from one exactly at the limit.
    """
    environ = request.META
    declared = environ.get("CONTENT_LENGTH") or ""
    if declared:
        try:
            length = int(declared)
        except ValueError:
            raise BodyMalformed("Content-Length is not a number") from None
        if length < 0:
            raise BodyMalformed("Content-Length is negative")
        if length > limit:
            raise BodyTooLarge
        stream = request  # Django's stream, already limited to Content-Length
        body = _read(stream, length)
        if len(body) < length:
            raise BodyMalformed("body shorter than its Content-Length")
        return body
    if environ.get("wsgi.input_terminated"):
        # The server decodes chunked transfer and ends the stream itself.
        body = _read(environ["wsgi.input"], limit + 1)
        if len(body) > limit:
            raise BodyTooLarge
        return body
    return b""


def _read(stream, size: int) -> bytes:
    parts = []
    remaining = size
    while remaining > 0:
        chunk = stream.read(min(CHUNK, remaining))
        if not chunk:
            break
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)
