"""Who the client is, which request this is, and what a throttled login sees."""

import contextlib
import functools
import ipaddress
import re
import uuid

from django.conf import settings
from django.core.signals import request_finished
from django.dispatch import receiver
from django.http import HttpResponse

from webhooker import request_context

# A caller's own request id, kept when it looks like one: a UUID, a trace id, a
# load balancer's (AWS's "Root=1-..."); anything else is replaced.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}\Z")


class RequestIdMiddleware:
    """Every response carries X-Request-Id: the caller's own if it is sane, else a
    new one. Every log line written while the request is served carries it
    (deliveries/logs.py), and an inbound event stores it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get("X-Request-Id", "")
        request.request_id = given if SANE_REQUEST_ID.match(given) else uuid.uuid4().hex
        # Until the response is closed (request_finished): Django logs an error
        # answer after the middleware has returned it.
        request_context.request_id.set(request.request_id)
        response = self.get_response(request)
        response["X-Request-Id"] = request.request_id
        return response


@receiver(request_finished)
def _request_served(sender, **kwargs):
    request_context.request_id.set(None)
    request_context.api_key.set(None)


@functools.lru_cache(maxsize=8)
def _networks(values: tuple):
    return tuple(ipaddress.ip_network(v, strict=False) for v in values)


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in _networks(tuple(settings.WEBHOOKER_TRUSTED_PROXIES)))


class TrustedProxyMiddleware:
    """Replace REMOTE_ADDR with the client's address when a trusted proxy says it.

    Only a request whose socket peer is in WEBHOOKER_TRUSTED_PROXIES is believed,
    and X-Forwarded-For is read from the right, past every trusted hop: the first
    address no trusted proxy added is the client. Anyone else's X-Forwarded-For is
    ignored, so a sender cannot choose the source address stored with its event.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        meta = request.META
        forwarded = meta.get("HTTP_X_FORWARDED_FOR")
        if (
            forwarded
            and settings.WEBHOOKER_TRUSTED_PROXIES
            and _trusted(meta.get("REMOTE_ADDR", ""))
        ):
            hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
            while hops and _trusted(hops[-1]):
                hops.pop()
            if hops:
                with contextlib.suppress(ValueError):
                    meta["REMOTE_ADDR"] = str(ipaddress.ip_address(hops[-1]))
        return self.get_response(request)


def client_ip(request):
    """django-axes counts failures per this address (after the middleware above)."""
    return request.META.get("REMOTE_ADDR", "")


def login_throttled(request, credentials, *args):
    response = HttpResponse(
        "Too many failed logins from your address. Wait a minute, then try again.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response
