"""gunicorn's worker class: uvicorn's, with webhooker's protocol."""

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
