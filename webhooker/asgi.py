"""The web side as gunicorn serves it (gunicorn.conf.py): Django's WSGI application
behind the event-loop front in webhooker/server/."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhooker.settings")

django_application = get_wsgi_application()


def _build():
    from django.conf import settings

    from webhooker.server.bridge import Edge

    return Edge(
        django_application,
        threads=settings.WEB_THREADS,
        queue=settings.WEB_QUEUE,
        body_timeout=settings.WEBHOOKER_BODY_TIMEOUT,
        max_body=settings.WEBHOOKER_MAX_BODY_BYTES,
        body_buffer=settings.WEB_BODY_BUFFER,
        probes=("/.well-known/healthcheck", "/metrics"),
    )


application = _build()
