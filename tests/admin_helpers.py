"""Users' worlds for the admin and ownership tests."""

from django.test import Client

from deliveries.models import Delivery, DeliveryResult, Target, Webhook
from tests.engine_helpers import store


def client_for(user):
    client = Client()
    client.force_login(user)
    return client


def world(owner, name):
    """A webhook with an http target, one event and its failed delivery:
    (webhook, target, event, delivery)."""
    hook = Webhook.objects.create(name=name, owner=owner)
    hook.ensure_entrypoint()
    target = Target.objects.create(
        webhook=hook, name=f"{name}-target", type="http", config={"url": "https://example.com/x"}
    )
    [event] = store(hook.entrypoints.get(), body=b'{"who": "%s"}' % name.encode())
    delivery = Delivery.objects.get(event=event)
    Delivery.objects.filter(pk=delivery.pk).update(status="failed", attempts=1)
    DeliveryResult.objects.create(
        delivery=delivery,
        attempt=1,
        success=False,
        status_code=500,
        error="HTTP 500",
        duration_ms=12,
    )
    return hook, target, event, Delivery.objects.get(pk=delivery.pk)


def act(client, url, data, **kwargs):
    """Run a bulk action as a user does: choose it, then confirm the number shown."""
    response = client.post(url, data)
    if response.status_code != 200:  # nothing to act on: back to the list
        return response
    hidden = response.context["hidden"]
    return client.post(url, {**hidden, "confirm": "1"}, **kwargs)
