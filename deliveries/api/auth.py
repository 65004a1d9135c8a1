"""API keys: `Authorization: Bearer <key>`, the key acting as its user."""

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from deliveries.models import ApiKey
from webhooker import request_context


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Bearer <key>'.")
        try:
            key = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API key.") from None
        now = timezone.now()
        api_key = ApiKey.objects.find(key, now)
        # One answer for unknown, revoked and expired keys and inactive users: the
        # reason is the key owner's to see in the admin, not the caller's.
        if api_key is None or not api_key.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, revoked or expired API key.")
        api_key.touch(now)
        request_context.api_key.set(str(api_key))
        return api_key.user, api_key

    def authenticate_header(self, request):
        # Makes DRF answer 401 (with WWW-Authenticate), not 403, without a key.
        return f'{self.keyword} realm="api"'


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key created in the admin (API keys) or with "
            "`manage.py createapikey`.",
        }
