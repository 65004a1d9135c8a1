from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle


class ApiKeyThrottle(SimpleRateThrottle):
    """At most API_THROTTLE_RATE requests per key. The counts live in Django's cache:
    the default (local memory) keeps them per process, so N gunicorn workers allow
    up to N times the rate; a shared cache (Redis, memcached) makes it exact."""

    scope = "api_key"

    def get_rate(self):
        # Read per request, not at import as DRF's default does, so that the
        # setting can change under tests and between deployments alike.
        return settings.API_THROTTLE_RATE

    def get_cache_key(self, request, view):
        if request.auth is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}
