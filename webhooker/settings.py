"""Settings for webhooker: the environment is the only source
(docs/architecture.md, Configuration and settings at import time).

Every variable has a default that lets a fresh clone run (`make run`) with nothing
set. Bad values fail at start with ImproperlyConfigured naming the variable, never
later with a traceback from somewhere deep.
"""

import datetime
import ipaddress
import os
import secrets
import tempfile
import urllib.parse
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)


def _choice(name, default, choices):
    value = env.str(name, default=default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not valid; expected one of: {', '.join(choices)}"
        )
    return value


def _number(name, default, *, cast=int, minimum=0):
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise ImproperlyConfigured(f"{name}={raw!r} is not {kind}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def _list(name):
    return [item.strip() for item in env.str(name, default="").split(",") if item.strip()]


def _networks(name):
    values = _list(name)
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {value!r} is not an IP address or network (CIDR)"
            ) from None
    return values


def _rate(name, default):
    value = env.str(name, default=default).strip()
    number, _, period = value.partition("/")
    if not (number.isdigit() and period in ("s", "sec", "m", "min", "h", "hour", "d", "day")):
        raise ImproperlyConfigured(f"{name}={value!r} is not a rate such as 600/min")
    return value


def _generated(data_dir, name, make):
    """The contents of DATA_DIR/<name>, generated once by `make()` on a fresh DATA_DIR.

    The only files settings write: every process (each gunicorn worker, the engine,
    every command) needs the same keys before Django starts, and the first of them
    to load settings is the only one that can make them. The value is written to a
    private temporary file and then hard-linked into place, which fails if the file
    exists: gunicorn workers and rundelivery starting at the same moment all end up
    reading the one complete value that won.
    """
    path = data_dir / name
    if not path.exists():
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ImproperlyConfigured(
                f"DATA_DIR={str(data_dir)!r} cannot be created: {exc}"
            ) from None
        fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{name}.")  # mode 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(make() + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    value = path.read_text().strip()
    if not value:
        raise ImproperlyConfigured(f"{path} is empty; delete it to generate a new one")
    return value


def _secret_key(data_dir):
    """SECRET_KEY from the environment, else generated once into DATA_DIR/secret_key."""
    return env.str("SECRET_KEY", default="") or _generated(
        data_dir, "secret_key", lambda: secrets.token_urlsafe(50)
    )


def _encryption_keys(data_dir):
    """The Fernet keys secrets are encrypted with at rest (webhooker/encryption.py):
    WEBHOOKER_ENCRYPTION_KEYS, comma-separated (the first encrypts, all decrypt),
    else one generated once into DATA_DIR/encryption_keys."""
    keys = _list("WEBHOOKER_ENCRYPTION_KEYS") or [
        _generated(data_dir, "encryption_keys", lambda: Fernet.generate_key().decode())
    ]
    for n, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except ValueError:
            raise ImproperlyConfigured(
                f"encryption key {n} is not a Fernet key (32 url-safe base64-encoded bytes; "
                "make one with: python3 -c 'import base64, os; "
                "print(base64.urlsafe_b64encode(os.urandom(32)).decode())')"
            ) from None
    return keys


ENVIRONMENT = _choice("WEBHOOKER_ENVIRONMENT", "dev", ("dev", "prod"))
PRODUCTION = ENVIRONMENT == "prod"
DEBUG = not PRODUCTION and env.bool("DEBUG", default=True)

# Created when Django starts (deliveries/apps.py), or first for the secret key.
DATA_DIR = Path(env.str("DATA_DIR", default="/data" if PRODUCTION else str(BASE_DIR / "data")))

SECRET_KEY = _secret_key(DATA_DIR)
ENCRYPTION_KEYS = _encryption_keys(DATA_DIR)

# Prometheus counters are shared by gunicorn's workers and the engine through
# files here (prometheus-client's multiprocess mode). prometheus_client reads the
# variable once, when first imported; settings are what every process loads
# before that, so this is the one place that can set it for all of them.
METRICS_DIR = DATA_DIR / "metrics"
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(METRICS_DIR))
if PRODUCTION and (len(SECRET_KEY) < 50 or SECRET_KEY.startswith("django-insecure")):
    raise ImproperlyConfigured("SECRET_KEY must be at least 50 random characters in prod")

ALLOWED_HOSTS = _list("ALLOWED_HOSTS")
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when WEBHOOKER_ENVIRONMENT=prod")
if not ALLOWED_HOSTS:
    ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    # The admin's look (django-unfold): before django.contrib.admin, whose
    # templates it overrides; its filters app gives the dropdown and date-range filters.
    "unfold",
    "unfold.contrib.filters",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI's files, served from here: the docs page loads nothing from the internet.
    "drf_spectacular_sidecar",
    # The audit log (deliveries/audit.py).
    "auditlog",
    "deliveries",
]

MIDDLEWARE = [
    # Before anything that may log: each line of a request carries its id.
    "deliveries.middleware.RequestIdMiddleware",
    # First of the rest, so everything after it (login throttling, the stored source address)
    # sees the client's address rather than the proxy's.
    "deliveries.middleware.TrustedProxyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's static files from gunicorn itself: no second server needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Who, from where, with which request id: stamped on audit entries.
    "deliveries.audit.AuditMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it answers 429 to a throttled login.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# --- Admin (django-unfold) ------------------------------------------------------
# Callables are named by path and called per request (deliveries/admin/console.py): the
# sidebar lists only what the user may see; the login throttling tables sit under
# "Security", for superusers only.
# Where a login without ?next= lands: unfold's login form, unlike Django's own,
# carries no "next" field, and Django's default (/accounts/profile/) is no page here.
LOGIN_REDIRECT_URL = "/admin/"
UNFOLD = {
    "SITE_TITLE": "webhooker",
    "SITE_HEADER": "webhooker",
    "SITE_SYMBOL": "webhook",
    # No "View site" link: the console is the site (nothing is served at /).
    "SITE_URL": None,
    "SHOW_HISTORY": False,
    "SHOW_VIEW_ON_SITE": False,
    "SIDEBAR": {
        "show_search": False,
        "show_all_applications": False,
        "navigation": "deliveries.admin.console.navigation",
    },
    "STYLES": ["deliveries.admin.console.stylesheet"],
    "SCRIPTS": ["deliveries.admin.console.script"],
}

# --- Login throttling (django-axes) ----------------------------------------------
# At most 5 failed logins per client address per minute; the 6th gets 429 until
# the minute since the last failure has passed. (Axes answers 429 already to the
# failure that reaches its limit, hence 6.)
AXES_FAILURE_LIMIT = 6
AXES_COOLOFF_TIME = datetime.timedelta(minutes=1)
AXES_LOCKOUT_PARAMETERS = ["ip_address"]
AXES_HTTP_RESPONSE_CODE = 429
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "deliveries.middleware.client_ip"
AXES_LOCKOUT_CALLABLE = "deliveries.middleware.login_throttled"
AXES_VERBOSE = False

ROOT_URLCONF = "webhooker.urls"
WSGI_APPLICATION = "webhooker.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------
SQLITE_PATH = DATA_DIR / "webhooker.sqlite3"
try:
    DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{SQLITE_PATH}")}
except (ValueError, KeyError) as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None

_engine = DATABASES["default"].get("ENGINE")
if _engine == "django.db.backends.sqlite3":
    _sqlite_busy = _number("SQLITE_BUSY_TIMEOUT", 20.0, cast=float, minimum=0)
    # Django's backend plus a file lock that queues writers (webhooker/db/sqlite).
    DATABASES["default"]["ENGINE"] = "webhooker.db.sqlite"
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes the write lock at BEGIN, so a transaction never has to
        # upgrade a read lock to a write lock mid-way: that upgrade is what makes
        # SQLite answer "database is locked" at once, busy timeout or not.
        "transaction_mode": "IMMEDIATE",
        # Seconds a writer waits for the lock before giving up (the inbound view
        # then answers 503 with Retry-After).
        "timeout": _sqlite_busy,
        # WAL lets readers run beside the one writer. synchronous=FULL syncs the WAL
        # at every commit: a 200 from the inbound view promises the event survives a
        # power cut. NORMAL (SQLITE_SYNCHRONOUS) only promises it survives a crash
        # of the process, for more events per second (bench/RESULTS.md).
        # A new file also gets incremental auto-vacuum (webhooker/db/sqlite).
        "init_command": (
            "PRAGMA journal_mode=WAL;"
            f"PRAGMA synchronous={_choice('SQLITE_SYNCHRONOUS', 'full', ('full', 'normal'))};"
            "PRAGMA foreign_keys=ON;"
            f"PRAGMA busy_timeout={int(_sqlite_busy * 1000)};"
        ),
    }
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test_webhooker.sqlite3")}
elif _engine in ("django.db.backends.postgresql",):
    # Django's backend with a health check that costs no round trip (webhooker/db/postgresql).
    DATABASES["default"]["ENGINE"] = "webhooker.db.postgresql"
    DATABASES["default"].setdefault("OPTIONS", {})
else:
    raise ImproperlyConfigured(
        f"DATABASE_URL selects {_engine or 'no known engine'}; "
        "webhooker supports SQLite and PostgreSQL"
    )
DATABASES["default"]["CONN_MAX_AGE"] = _number("CONN_MAX_AGE", 60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

# --- Production hardening ---------------------------------------------------------
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _number("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    # The directive only permits submitting the domain to browsers' preload list;
    # nothing is submitted unless the operator does it.
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
    # Off when a proxy in front terminates TLS and redirects itself.
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
# Opt-in: trust X-Forwarded-Proto: https only when a proxy you run sets it.
if env.bool("WEBHOOKER_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["webhooker.formats"]

STATIC_URL = "static/"
# Created by collectstatic (`make run` runs it).
STATIC_ROOT = DATA_DIR / "static"
# In dev the files are found where they live; prod serves what collectstatic wrote.
WHITENOISE_USE_FINDERS = not PRODUCTION

# --- Inbound --------------------------------------------------------------------
WEBHOOKER_MAX_BODY_BYTES = _number("WEBHOOKER_MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1)
# On SQLite, bodies of this many bytes or more are files in DATA_DIR/bodies, written
# before the event's row, so SQLite's one writer never holds them
# (deliveries/bodies.py); 0 keeps every body in its row. PostgreSQL keeps every body
# in its row. At least 64 KiB: the engine carries bodies up to 16 KiB from the row.
WEBHOOKER_BODY_FILE_BYTES = _number("WEBHOOKER_BODY_FILE_BYTES", 1024 * 1024, minimum=0)
if 0 < WEBHOOKER_BODY_FILE_BYTES < 64 * 1024:
    raise ImproperlyConfigured(
        f"WEBHOOKER_BODY_FILE_BYTES={WEBHOOKER_BODY_FILE_BYTES} must be 0 or at least 65536"
    )
# Seconds between refreshes of the console's live pages: the dashboard's figures, and
# a delivery or a replay job the engine may still change (each reloads itself).
WEBHOOKER_CONSOLE_REFRESH = _number("WEBHOOKER_CONSOLE_REFRESH", 5, minimum=1)
# Seconds a client has to send a request's line and headers, from the connection's
# start (or a later request's first byte on it); past this, the connection is closed.
WEBHOOKER_HEADER_TIMEOUT = _number("WEBHOOKER_HEADER_TIMEOUT", 10.0, cast=float, minimum=0.1)
# Seconds a client has to send a whole request body: the event loop (webhooker/server/)
# reads it, so a slow sender costs a connection, never a thread; past this, 408.
WEBHOOKER_BODY_TIMEOUT = _number("WEBHOOKER_BODY_TIMEOUT", 30.0, cast=float, minimum=0.1)
# Threads running Django in each web worker, and requests allowed to wait for one
# beyond them; past both, 503 with Retry-After at once. A queue of 8 per thread
# waits at most a few tens of milliseconds at about a millisecond per event.
WEB_THREADS = _number("WEB_THREADS", 4, minimum=1)
WEB_QUEUE = _number("WEB_QUEUE", 32, minimum=0)
# Bytes of request bodies a web worker holds in memory at once, beyond each body's
# first 64 KiB (webhooker/server/bridge.py, SMALL_BODY); past them, 503 with Retry-After at
# once. A body larger than this is still served when it is the only one.
WEB_BODY_BUFFER = _number("WEB_BODY_BUFFER", 64 * 1024 * 1024, minimum=1)
WEBHOOKER_PUBLIC_URL = env.str("WEBHOOKER_PUBLIC_URL", default="").rstrip("/")
WEBHOOKER_ALLOWED_TARGET_NETWORKS = _networks("WEBHOOKER_ALLOWED_TARGET_NETWORKS")
WEBHOOKER_TRUSTED_PROXIES = _networks("WEBHOOKER_TRUSTED_PROXIES")
METRICS_USERNAME = env.str("METRICS_USERNAME", default="")
METRICS_PASSWORD = env.str("METRICS_PASSWORD", default="")
# Seconds a rotated-out signing secret still signs deliveries beside the new one:
# a day lets receivers deploy the new secret without rejecting anything meanwhile.
SIGNING_ROTATION_OVERLAP = _number("SIGNING_ROTATION_OVERLAP", 86_400.0, cast=float, minimum=0)

# --- Audit log (django-auditlog; deliveries/audit.py) ------------------------------
# Entries older than this are deleted with the daily prune.
AUDIT_RETENTION_DAYS = _number("AUDIT_RETENTION_DAYS", 365, minimum=1)
# An entry's correlation id is its request's id (X-Request-Id), not a header of its own.
AUDITLOG_CID_GETTER = "deliveries.audit.request_id"

# --- Delivery engine (docs/architecture.md, The engine); read when it is built -------------
DELIVERY_WORKERS = _number("DELIVERY_WORKERS", 4, minimum=1)
DELIVERY_INFLIGHT = _number("DELIVERY_INFLIGHT", 5000, minimum=1)
DELIVERY_CHANNEL_SIZE = _number("DELIVERY_CHANNEL_SIZE", 10_000, minimum=1)
DELIVERY_POLL_INTERVAL = _number("DELIVERY_POLL_INTERVAL", 1.0, cast=float, minimum=0.01)
DELIVERY_RECOVERY_INTERVAL = _number("DELIVERY_RECOVERY_INTERVAL", 60.0, cast=float, minimum=0.01)
DELIVERY_STALE_AFTER = _number("DELIVERY_STALE_AFTER", 900.0, cast=float, minimum=0)
DELIVERY_RECOVERY_BATCH = _number("DELIVERY_RECOVERY_BATCH", 500, minimum=1)
DELIVERY_TARGET_CONCURRENCY = _number("DELIVERY_TARGET_CONCURRENCY", 15, minimum=1)
# How many of one replay job's deliveries to one target are queued at a time
# (deliveries/replays.py): pausing or cancelling a job lets at most these finish.
REPLAY_WINDOW = _number("REPLAY_WINDOW", 100, minimum=1)
DELIVERY_HTTP_TIMEOUT = _number("DELIVERY_HTTP_TIMEOUT", 10.0, cast=float, minimum=0.1)
# A PEM bundle of the CAs that https targets may present (a private CA inside the
# network); empty: the public roots.
# A forward proxy every http and Slack delivery goes through (a target may name its
# own): http://[user:password@]host:port; https destinations are tunnelled (CONNECT).
DELIVERY_PROXY = env.str("DELIVERY_PROXY", default="")
_proxy = urllib.parse.urlsplit(DELIVERY_PROXY)
if DELIVERY_PROXY and (_proxy.scheme != "http" or not _proxy.hostname or _proxy.path.strip("/")):
    raise ImproperlyConfigured(
        f"DELIVERY_PROXY must be http://[user:password@]host:port, not {_proxy.scheme}://…"
    )
DELIVERY_CA_BUNDLE = env.str("DELIVERY_CA_BUNDLE", default="")
if DELIVERY_CA_BUNDLE and not Path(DELIVERY_CA_BUNDLE).is_file():
    raise ImproperlyConfigured(f"DELIVERY_CA_BUNDLE={DELIVERY_CA_BUNDLE!r} is not a file.")
# Target transforms (jq, deliveries/transforms/): run in this many worker processes
# per process that needs them (the engine; a web worker previewing one), each call
# stopped after DELIVERY_TRANSFORM_TIMEOUT seconds and within DELIVERY_TRANSFORM_MEMORY
# megabytes of address space.
DELIVERY_TRANSFORM_WORKERS = _number("DELIVERY_TRANSFORM_WORKERS", 2, minimum=1)
DELIVERY_TRANSFORM_TIMEOUT = _number("DELIVERY_TRANSFORM_TIMEOUT", 1.0, cast=float, minimum=0.01)
DELIVERY_TRANSFORM_MEMORY = _number("DELIVERY_TRANSFORM_MEMORY", 256, minimum=64)
DELIVERY_BACKOFF_BASE = _number("DELIVERY_BACKOFF_BASE", 1.0, cast=float, minimum=0)
DELIVERY_BACKOFF_CAP = _number("DELIVERY_BACKOFF_CAP", 3600.0, cast=float, minimum=0)
# A target whose every attempt failed for this long is paused (Svix's 5 days: long
# enough to outlast a weekend outage, short enough not to retry a dead URL forever).
DELIVERY_DISABLE_AFTER = _number("DELIVERY_DISABLE_AFTER", 5 * 86_400.0, cast=float, minimum=1)

# PostgreSQL: every delivery belongs to one of this many partitions (by its target);
# engines share the database by holding partitions. Fixed for the life of the
# database: 64 spreads evenly over up to a few dozen engines, and an engine holding
# many costs one advisory lock each.
DELIVERY_PARTITIONS = _number("DELIVERY_PARTITIONS", 64, minimum=1)
# Seconds between two looks at whether to hand partitions over to balance the
# engines (free partitions are taken at every lease renewal, twice a second).
DELIVERY_REBALANCE_INTERVAL = _number("DELIVERY_REBALANCE_INTERVAL", 5.0, cast=float, minimum=0.05)
# An engine attempts in its partitions only while less than this many seconds have
# passed since the start of its last round trip to PostgreSQL on its lock connection
# (renewed twice a second). It must stay well below the server's keepalive bound
# (about 11 s) and DELIVERY_EVICT_AFTER; the next holder of a partition an engine
# lost without handing it over waits out what is left of this lease.
DELIVERY_LEASE_SECONDS = _number("DELIVERY_LEASE_SECONDS", 2.0, cast=float, minimum=0.5)
# Seconds without a lease renewal after which the other engines end an engine's lock
# session (frozen, stuck, cut off) and take its partitions.
DELIVERY_EVICT_AFTER = _number("DELIVERY_EVICT_AFTER", 6.0, cast=float, minimum=1.0)
if DELIVERY_LEASE_SECONDS > 5.0:
    raise ImproperlyConfigured(
        f"DELIVERY_LEASE_SECONDS={DELIVERY_LEASE_SECONDS} must be at most 5: PostgreSQL "
        "releases a silent engine's locks after about 11 s, and its lease must run out first"
    )
if DELIVERY_EVICT_AFTER < 2 * DELIVERY_LEASE_SECONDS:
    raise ImproperlyConfigured(
        f"DELIVERY_EVICT_AFTER={DELIVERY_EVICT_AFTER} must be at least twice "
        f"DELIVERY_LEASE_SECONDS={DELIVERY_LEASE_SECONDS}: an engine is evicted only "
        "once its own lease has certainly run out"
    )

# --- Alerts (deliveries/alerts.py) --------------------------------------------------
# Seconds a breaker may stay open before the webhook's owner is told.
ALERT_BREAKER_AFTER = _number("ALERT_BREAKER_AFTER", 600.0, cast=float, minimum=1)
# The console backend by default, so `make run` prints the alerts it would send;
# e.g. EMAIL_URL=smtp+tls://user:password@mail.example.com:587 for real mail.
try:
    _email = env.email_url_config(env.str("EMAIL_URL", default="consolemail://"))
except ImproperlyConfigured as exc:
    raise ImproperlyConfigured(f"EMAIL_URL is not a usable email URL: {exc}") from None
# Unset parts stay Django's defaults rather than becoming None.
globals().update({key: value for key, value in _email.items() if value is not None})
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="webhooker@localhost")
# Seconds an alert email may take to send; a mail server that does not answer must
# not hold the engine's alerts thread (Django's default is to wait forever).
EMAIL_TIMEOUT = _number("EMAIL_TIMEOUT", 10, minimum=1)

# --- REST API (deliveries/api) -----------------------------------------------------
# Requests per API key, counted in Django's cache (per process unless a shared
# cache is configured: see deliveries/api/throttling.py).
API_THROTTLE_RATE = _rate("API_THROTTLE_RATE", "600/min")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["deliveries.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["deliveries.api.throttling.ApiKeyThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "deliveries.api.pagination.NewestFirst",
    "DEFAULT_SCHEMA_CLASS": "deliveries.api.schema.ApiSchema",
    "EXCEPTION_HANDLER": "deliveries.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "webhooker API",
    "DESCRIPTION": "Webhooks, their entrypoints and targets, events and deliveries: "
    "everything the admin does. Authenticate with `Authorization: Bearer <API key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its docs page are public: they describe the API, not anyone's data.
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "ENUM_NAME_OVERRIDES": {"DeliveryStatus": "deliveries.models.Delivery.Status"},
    # Request bodies get components of their own (WebhookRequest...), so what a write
    # must send is exact: required fields, no read-only ones, minLength of non-blank
    # strings (schemathesis checks it against the API).
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "deliveries.api.schema.closed_request_bodies",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # A request's lines end with its request_id=... (deliveries/logs.py).
        "plain": {
            "()": "deliveries.logs.PlainFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        # One JSON object per line, `extra=` fields included (deliveries/logs.py).
        "json": {"()": "deliveries.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": _choice("LOG_FORMAT", "plain", ("plain", "json")),
        },
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # In place of Django's own console handler (plain text, DEBUG only), so
        # that its lines (a 404, a DisallowedHost) follow LOG_FORMAT too.
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "deliveries": {
            "handlers": ["console"],
            "level": _choice("LOG_LEVEL", "info", ("debug", "info", "warning", "error")).upper(),
            "propagate": False,
        },
    },
}

# --- Error reporting ------------------------------------------------------------------
# With SENTRY_DSN, unhandled errors (web and engine) and error log lines go to
# Sentry. No request bodies or personal data are sent: events carry webhooks'
# payloads, which are their senders' data, not ours to ship elsewhere.
SENTRY_DSN = env.str("SENTRY_DSN", default="")
if SENTRY_DSN:
    import sentry_sdk

    def _without_payload(event, hint):
        # The request's query string may carry a sender's token; its body never
        # leaves (max_request_body_size), nor do the stack's local variables.
        request = event.get("request")
        if isinstance(request, dict):
            for key in ("query_string", "data", "cookies"):
                request.pop(key, None)
        return event

    sentry_sdk.init(
        dsn=SENTRY_DSN,
        environment=env.str("SENTRY_ENVIRONMENT", default="prod" if PRODUCTION else "dev"),
        send_default_pii=False,
        max_request_body_size="never",
        # A traceback's local variables hold bodies, headers and secrets.
        include_local_variables=False,
        before_send=_without_payload,
        traces_sample_rate=0.0,
    )
