"""The web side's front: requests are read by an event loop, handled by a few threads
(gunicorn runs `webhooker.server.worker.Worker`).

gthread workers read each request body on one of their few threads, so twelve
senders trickling bodies held every thread and stopped all ingest. Here gunicorn
runs uvicorn's worker, whose event loop reads every request - headers and whole
body, each under a deadline - and only a complete request reaches Django, on a
small pool of threads, as a buffering proxy in front would arrange. A slow sender
costs a connection and a few kilobytes, never a thread.

Django runs behind it as the WSGI application it always was, not through its
ASGIHandler: that handler gives every request a thread of its own, with a fresh
database connection each time and no bound on how many; the pool here keeps
`threads` threads and their persistent connections (CONN_MAX_AGE).

Admission is bounded: past `threads + queue` requests in this worker, a request is
answered 503 with Retry-After at once, from the event loop, so a flood is shed in
microseconds per request and the backlog a worker can build is `queue` requests
deep, which is why it recovers as soon as the flood stops.

Responses held whole are sent by the event loop; a streaming response (an export,
a file) is written from its pool thread piece by piece as it is produced, each write
waiting for the client to take it (bridge._Stream).

A sender that hangs up is "gone": its request is skipped if it has not started,
and the inbound view checks just before COMMIT (environ["webhooker.gone"]), so an
event is never stored for a sender that saw a timeout and will send it again.
"""

# bridge.py: the ASGI application that reads each request whole on the event loop and
# runs Django (WSGI) on a few threads; protocol.py: uvicorn's HTTP protocol with the
# request limits it lacks (every use of uvicorn's internals is there); worker.py:
# gunicorn's worker class.
