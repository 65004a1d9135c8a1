"""A safe API (issue 28, found from outside with schemathesis): what a client did
not mean is refused in words, never silently dropped. A typo must not widen a bulk
action."""

import pytest
from rest_framework.test import APIClient

from deliveries.models import Delivery, Target
from tests.support.api import client_of, key_for, world_ids

pytestmark = pytest.mark.django_db


@pytest.fixture
def mine(alice):
    return world_ids(alice, "alice-hook")


def refused(response, *names):
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body["fields"]) == set(names), body
    return body


def test_an_unknown_key_in_a_bulk_action_is_refused_not_ignored(alice, mine):
    body = {"webhok": 99, "target": mine["target"], "status": "failed"}
    answer = refused(
        client_of(alice).post("/api/v1/deliveries/redeliver/", body, format="json"), "webhok"
    )
    assert answer["fields"]["webhok"] == ["Unknown field."]
    assert Delivery.objects.get(pk=mine["delivery"]).status == "failed"  # nothing queued


def test_an_unknown_key_in_a_write_is_refused(alice, mine):
    url = f"/api/v1/targets/{mine['target']}/"
    refused(client_of(alice).patch(url, {"nmae": "renamed"}, format="json"), "nmae")
    assert Target.objects.get(pk=mine["target"]).name == "alice-hook-target"
    refused(client_of(alice).post(f"{url}pause/", {"reson": "x"}, format="json"), "reson")
    assert not Target.objects.get(pk=mine["target"]).paused


def test_read_only_fields_sent_back_with_a_write_are_fine(alice, mine):
    url = f"/api/v1/targets/{mine['target']}/"
    current = client_of(alice).get(url).json()
    response = client_of(alice).put(url, {**current, "name": "renamed"}, format="json")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("webhok=1", "webhok"),
        ("until=", "until"),
        ("limit=abc", "limit"),
        ("limit=null", "limit"),
        ("limit=0", "limit"),
    ],
)
def test_bad_or_unknown_query_parameters_are_refused(alice, mine, query, name):
    refused(client_of(alice).get(f"/api/v1/events/?{query}"), name)


def test_the_pages_own_parameters_are_known(alice, mine):
    first = client_of(alice).get("/api/v1/deliveries/?limit=1&status=failed")
    assert first.status_code == 200
    assert client_of(alice).get("/api/v1/events/?limit=5").status_code == 200


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
@pytest.mark.parametrize("path", ["targets/abc/pause/", "targets/1x/", "webhooks/../", "nowhere/"])
def test_a_write_to_a_path_that_names_nothing_is_the_apis_json_404(alice, method, path):
    # As a client sends it: with a key, without a CSRF token (the API needs none).
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_for(alice)}")
    response = getattr(client, method)(f"/api/v1/{path}", {}, format="json")
    assert response.status_code == 404
    assert response.json() == {"error": "Not found.", "fields": {}}
