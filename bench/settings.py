"""Settings for the benchmarks: webhooker's own, plus the routes they compare against.

bench/run.py starts every process with DJANGO_SETTINGS_MODULE=bench.settings, so the
production URLconf never knows about bench/.
"""

from django.core.exceptions import ImproperlyConfigured

from webhooker.settings import *  # noqa: F403
from webhooker.settings import PRODUCTION

# A no-op endpoint and a hand-off to a Celery worker that a deployment does not
# run are no part of the product: refuse rather than serve them in production.
if PRODUCTION:
    raise ImproperlyConfigured("bench.settings is for benchmarks, not WEBHOOKER_ENVIRONMENT=prod")

ROOT_URLCONF = "bench.urls"
