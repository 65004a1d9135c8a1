"""gunicorn settings for webhooker's web side (`make run` and the benchmarks).

The inbound endpoint faces the internet, so every request limit here is chosen,
not inherited. gthread workers keep idle keep-alive connections off the worker
threads, so slow or idle senders cannot occupy them all.
"""

import multiprocessing
import os

_prod = os.environ.get("WEBHOOKER_ENVIRONMENT", "dev").strip().lower() == "prod"

bind = os.environ.get("WEBHOOKER_BIND", "0.0.0.0:8080" if _prod else "127.0.0.1:8080")
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() + 1))
threads = int(os.environ.get("WEB_THREADS", 4))

# A worker that does not report within this many seconds is restarted.
timeout = 60
graceful_timeout = 30
keepalive = 5

# Request-line and header limits: generous for real senders (long signed URLs,
# big signature headers), small enough that a flood of headers costs little.
limit_request_line = 8190
limit_request_fields = 200
limit_request_field_size = 16384

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")

# gunicorn's control socket lives in the user's home and is shared by every
# instance; webhooker does not use it.
control_socket_disable = True
