"""gunicorn settings for webhooker's web side (`make run` and the benchmarks).

The inbound endpoint faces the internet, so every request limit here is chosen,
not inherited. The workers are uvicorn's (webhooker/server/): an event loop reads
requests, so slow or idle senders cannot occupy the threads that run Django.
"""

import multiprocessing
import os

_prod = os.environ.get("WEBHOOKER_ENVIRONMENT", "dev").strip().lower() == "prod"

bind = os.environ.get("WEBHOOKER_BIND", "0.0.0.0:8080" if _prod else "127.0.0.1:8080")
worker_class = "webhooker.server.worker.Worker"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() + 1))
# Threads per worker and the admission queue are Django settings (WEB_THREADS,
# WEB_QUEUE): the application, not gunicorn, owns them under this worker class.

# A worker that does not report within this many seconds is restarted.
timeout = 60
graceful_timeout = 30
keepalive = 5

# Request-line and header limits, and the deadline for a request's head, are
# enforced by webhooker.server.protocol.Protocol: uvicorn ignores gunicorn's limit_request_*.

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")

if os.environ.get("LOG_FORMAT", "plain").strip().lower() == "json":
    # gunicorn's and uvicorn's own lines as JSON too, like Django's (settings.LOGGING).
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "deliveries.logs.JsonFormatter"}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {
            name: {"handlers": ["console"], "level": loglevel.upper(), "propagate": False}
            for name in ("gunicorn.error", "gunicorn.access")
        },
    }

# gunicorn's control socket lives in the user's home and is shared by every
# instance; webhooker does not use it.
control_socket_disable = True
