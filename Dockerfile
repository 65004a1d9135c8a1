# webhooker: one image for the web side and the delivery engine (compose.yaml).
#   docker build -t webhooker .
#   docker run -e SECRET_KEY=... -e ALLOWED_HOSTS=... -e DATABASE_URL=... webhooker
#   docker run ... webhooker python manage.py rundelivery      # an engine
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    WEBHOOKER_ENVIRONMENT=prod \
    WEBHOOKER_BIND=0.0.0.0:8080 \
    DATA_DIR=/data \
    SECURE_SSL_REDIRECT=false
# TLS ends at the proxy in front of the container (which redirects http itself);
# inside, the healthcheck below speaks plain HTTP and must get its 200, not a redirect.

WORKDIR /app
# The dependencies exactly as locked, each file checked against its hash
# (requirements.lock, `make lock`), then webhooker itself with nothing more.
COPY requirements.lock .
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY . .
RUN pip install --no-deps --no-build-isolation . \
    && useradd --system --uid 10001 --home-dir /data webhooker \
    && mkdir -p /data && chown webhooker /data

# Non-root: the processes write only DATA_DIR (static files, metrics, the secret
# key when none is given).
USER webhooker
VOLUME /data
EXPOSE 8080

# Healthy while the database answers and every partition is held by a live engine.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/.well-known/healthcheck', timeout=4)"]

CMD ["sh", "-c", "python manage.py collectstatic --noinput -v 0 && exec python -m gunicorn -c webhooker/gunicorn.conf.py webhooker.asgi:application"]
