"""What the HTTP front tells the rest about the request it serves, in one neutral
place: the server (webhooker/server/) sets these, the inbound view and the SQLite
backend read them, and neither imports the other.
"""

import contextvars

# Keys of the WSGI environ that carry what CGI variables cannot.
RAW_HEADERS = "webhooker.headers"  # every header line as received, in order
GONE = "webhooker.gone"  # a threading.Event, set when the sender hangs up
# When the request was admitted (time.monotonic()).
ARRIVED = "webhooker.arrived"
# Key of the ASGI scope with the header names as the client spelled them (uvicorn
# lower-cases scope["headers"]), one per line, in order: set by the protocol, read by
# the bridge.
HEADER_NAMES = "webhooker.header_names"

# When the request this thread serves arrived (time.monotonic()), if it serves one:
# the SQLite writer lock's wait counts from it.
request_arrived: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "request_arrived", default=None
)

# The id of the request this thread serves (deliveries.middleware.RequestIdMiddleware):
# its answer's X-Request-Id, on every log line it writes, stored with its event.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# The API key (its name and prefix) that authenticated the request this thread
# serves, if one did (deliveries.api.auth): audit entries keep it.
api_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("api_key", default=None)
