"""Users' worlds for the admin and ownership tests."""

from html.parser import HTMLParser

from django.test import Client

from deliveries.models import Delivery, DeliveryResult, Target, Webhook
from tests.support.engines import store


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


def target_form_data(url, **fields):
    """The target page's POST data for an active http target to `url` (`fields`
    override or add form fields)."""
    return {
        "name": "t",
        "type": "http",
        "active": "on",
        "url": url,
        "max_retries": "3",
        "max_queue_size": "100",
        "rate_limit": "0",
        "filters": "[]",
        "initial-paused": "False",
        "initial-paused_reason": "",
        **fields,
    }


def inline_data(**target):
    """The webhook add form's POST data with one http target inline (`target`
    overrides its fields)."""
    data = {
        "name": "new hook",
        "description": "",
        "retention_days": "30",
        "entrypoints-TOTAL_FORMS": "0",
        "entrypoints-INITIAL_FORMS": "0",
        "entrypoints-MIN_NUM_FORMS": "0",
        "entrypoints-MAX_NUM_FORMS": "1000",
        "targets-TOTAL_FORMS": "1",
        "targets-INITIAL_FORMS": "0",
        "targets-MIN_NUM_FORMS": "0",
        "targets-MAX_NUM_FORMS": "1000",
        "targets-0-name": "t",
        "targets-0-type": "http",
        "targets-0-active": "on",
        "targets-0-max_retries": "3",
        "targets-0-max_queue_size": "100",
        "targets-0-url": "https://example.com/hook",
        "targets-0-headers": "",
        "targets-0-timeout": "",
        "targets-0-webhook_url": "",
    }
    data.update({f"targets-0-{k}": v for k, v in target.items()})
    return data


class Tags(HTMLParser):
    """Each start tag of a page: (tag, its attributes)."""

    def __init__(self, page):
        super().__init__()
        self.tags = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def find(self, tag, **attrs):
        return [a for t, a in self.tags if t == tag and attrs.items() <= a.items()]
