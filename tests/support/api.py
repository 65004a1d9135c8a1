"""Keys, clients and worlds for the API tests."""

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.core.cache import cache
from django.utils import timezone
from rest_framework.test import APIClient

from deliveries.models import ApiKey, Delivery, Entrypoint, Event, ReplayJob, Target, Webhook
from tests.support.admin import world


def key_for(user, name="test", **fields) -> str:
    api_key = ApiKey(user=user, name=name, **fields)
    key = api_key.set_new_key()
    api_key.save()
    return key


def client_with(key: str | None) -> APIClient:
    client = APIClient()
    if key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def client_of(user) -> APIClient:
    return client_with(key_for(user))


@pytest.fixture(autouse=True)
def fresh_throttle():
    """Throttle counts live in the cache, keyed by key id; ids repeat across tests."""
    cache.clear()
    yield
    cache.clear()


@dataclass(frozen=True)
class Call:
    """One operation of the API, named by its operationId in the schema, with a
    request that succeeds for the owner of the ids it is filled with."""

    name: str
    method: str
    # under /api/v1/, with {webhook}, {entrypoint}, {target}, {event}, {delivery}, {replay}
    path: str
    body: Callable[[dict], dict] | None = None
    status: int = 200

    def url(self, ids: dict) -> str:
        return "/api/v1/" + self.path.format(**ids)

    def send(self, client, ids: dict):
        data = self.body(ids) if self.body else None
        return getattr(client, self.method)(self.url(ids), data, format="json")

    @property
    def addresses_one(self) -> bool:
        """Names one row, in the path or as a bulk action's ids."""
        return "{" in self.path or self.name in ("events_replay", "deliveries_redeliver")


def listed_rows(response) -> list[dict]:
    """A list's rows: a page's results, or an export's JSON Lines."""
    if getattr(response, "streaming", False):
        text = b"".join(response.streaming_content).decode()
        return [json.loads(line) for line in text.splitlines()]
    return response.json()["results"]


def _http_target(ids):
    return {
        "webhook": ids["webhook"],
        "name": "new",
        "type": "http",
        "config": {"url": "https://hooks.example.com/in"},
    }


CALLS = [
    Call("webhooks_list", "get", "webhooks/"),
    Call("webhooks_create", "post", "webhooks/", lambda ids: {"name": "new"}, 201),
    Call("webhooks_retrieve", "get", "webhooks/{webhook}/"),
    Call(
        "webhooks_update",
        "put",
        "webhooks/{webhook}/",
        lambda ids: {"name": "renamed", "retention_days": 7},
    ),
    Call(
        "webhooks_partial_update",
        "patch",
        "webhooks/{webhook}/",
        lambda ids: {"description": "changed"},
    ),
    Call("webhooks_destroy", "delete", "webhooks/{webhook}/", status=204),
    Call("entrypoints_list", "get", "entrypoints/"),
    Call(
        "entrypoints_create",
        "post",
        "entrypoints/",
        lambda ids: {"webhook": ids["webhook"], "description": "second"},
        201,
    ),
    Call("entrypoints_retrieve", "get", "entrypoints/{entrypoint}/"),
    Call(
        "entrypoints_update",
        "put",
        "entrypoints/{entrypoint}/",
        lambda ids: {"webhook": ids["webhook"], "description": "renamed", "active": False},
    ),
    Call(
        "entrypoints_partial_update",
        "patch",
        "entrypoints/{entrypoint}/",
        lambda ids: {"active": False},
    ),
    Call("entrypoints_destroy", "delete", "entrypoints/{entrypoint}/", status=204),
    Call("targets_list", "get", "targets/"),
    Call("targets_create", "post", "targets/", _http_target, 201),
    Call("targets_retrieve", "get", "targets/{target}/"),
    Call("targets_update", "put", "targets/{target}/", _http_target),
    Call("targets_partial_update", "patch", "targets/{target}/", lambda ids: {"max_retries": 3}),
    Call("targets_destroy", "delete", "targets/{target}/", status=204),
    Call("targets_pause", "post", "targets/{target}/pause/", lambda ids: {"reason": "maintenance"}),
    Call("targets_resume", "post", "targets/{target}/resume/"),
    Call("targets_rotate_secret", "post", "targets/{target}/rotate-secret/"),
    Call(
        "targets_preview", "post", "targets/{target}/preview/", lambda ids: {"event": ids["event"]}
    ),
    Call("events_list", "get", "events/"),
    Call("events_export", "get", "events/export/"),
    Call(
        "events_resend",
        "post",
        "events/{event}/resend/",
        lambda ids: {"body": '{"edited": true}'},
        201,
    ),
    Call("events_retrieve", "get", "events/{event}/"),
    Call("events_body", "get", "events/{event}/body/"),
    Call("events_replay", "post", "events/replay/", lambda ids: {"ids": [ids["event"]]}),
    Call("deliveries_list", "get", "deliveries/"),
    Call("deliveries_export", "get", "deliveries/export/"),
    Call("deliveries_retrieve", "get", "deliveries/{delivery}/"),
    Call(
        "deliveries_redeliver",
        "post",
        "deliveries/redeliver/",
        lambda ids: {"ids": [ids["delivery"]]},
    ),
    Call("deliveries_retry", "post", "deliveries/{delivery}/retry/"),
    Call("audit_list", "get", "audit/"),
    Call("replays_list", "get", "replays/"),
    Call(
        "replays_create",
        "post",
        "replays/",
        lambda ids: {"webhook": ids["webhook"], "since": "2026-01-01T00:00:00Z"},
        201,
    ),
    Call("replays_retrieve", "get", "replays/{replay}/"),
    Call("replays_pause", "post", "replays/{replay}/pause/"),
    Call("replays_resume", "post", "replays/{replay}/resume/"),
    Call("replays_cancel", "post", "replays/{replay}/cancel/"),
]


def world_ids(user, name) -> dict:
    """A world (tests/admin_helpers.world) for `user`, as the ids CALLS are filled with."""
    hook, target, event, delivery = world(user, name)
    replay = ReplayJob.objects.create(
        webhook=hook, since=event.received_at, until=timezone.now(), state="paused"
    )
    return {
        "replay": replay.pk,
        "webhook": hook.pk,
        "entrypoint": hook.entrypoints.get().pk,
        "target": target.pk,
        "event": event.pk,
        "delivery": delivery.pk,
    }


def snapshot(user) -> dict:
    """Every row `user` owns, as values: to show another user's request changed nothing."""
    return {
        model.__name__: list(model.objects.visible_to(user).order_by("pk").values())
        for model in (Webhook, Entrypoint, Target, Event, Delivery)
    }
