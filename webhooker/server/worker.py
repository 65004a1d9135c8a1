"""gunicorn's worker class: uvicorn's, with webhooker's protocol."""

import asyncio
import signal
import sys

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from webhooker.server.protocol import Protocol


class Worker(UvicornWorker):
    """gunicorn's worker class for webhooker (gunicorn.conf.py)."""

    # proxy_headers off: uvicorn would take X-Forwarded-For and -Proto from any
    # peer in gunicorn's forwarded_allow_ips (127.0.0.1 by default), so a local
    # proxy passing clients' headers through would let them name their address.
    # Which proxies are trusted is WEBHOOKER_TRUSTED_PROXIES' to say
    # (deliveries.middleware.TrustedProxyMiddleware).
    CONFIG_KWARGS = {"loop": "asyncio", "http": Protocol, "lifespan": "on", "proxy_headers": False}

    async def _serve(self) -> None:
        # uvicorn-worker's, but SIGQUIT (gunicorn's quick stop, sent to every worker
        # on SIGINT or SIGQUIT) stops the server. Its own handler only marked the
        # gunicorn worker not alive, which uvicorn's server never looks at: the
        # arbiter waited its whole graceful timeout, then killed the workers.
        self.config.app = self.wsgi
        server = Server(config=self.config)
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGQUIT, server.handle_exit, signal.SIGQUIT, None
        )
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
