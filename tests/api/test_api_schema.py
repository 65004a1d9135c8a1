"""The OpenAPI schema: valid by drf-spectacular's own check, and true: every operation
in it answers with a status it documents, in the body it documents."""

import datetime

import jsonschema
import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone

from tests.support.api import (
    CALLS,
    client_of,
    client_with,
    fresh_throttle,  # noqa: F401
    key_for,
    world_ids,
)

pytestmark = pytest.mark.django_db

ROUTES = ["webhooks", "targets", "entrypoints", "events", "deliveries"]


@pytest.fixture(scope="module")
def schema(django_db_blocker, tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "schema.yaml"
    with django_db_blocker.unblock():
        # Warnings are errors: an operation the generator had to guess at fails here.
        call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    return yaml.safe_load(path.read_text())


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_the_schema_is_served_and_has_the_routes(client):
    response = client.get("/api/v1/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for route in ROUTES:
        assert f"/api/v1/{route}/" in paths


def test_every_operation_is_exercised_by_the_tests(schema):
    documented = {operation["operationId"] for _, _, operation in operations(schema)}
    assert documented == {call.name for call in CALLS}


def test_every_operation_requires_a_key_and_documents_its_errors(schema):
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    for path, _, operation in operations(schema):
        assert operation["security"] == [{"apiKey": []}]
        for code in ("401", "429", *(["404"] if "{" in path else [])):
            content = operation["responses"][code]["content"]["application/json"]
            assert content["schema"] == {"$ref": "#/components/schemas/Error"}


def _json_schema(node):
    """OpenAPI 3.0's `nullable` as JSON Schema, everything else as it is but oneOf:
    drf-spectacular writes a blank-or-URL field as oneOf [uri, empty], and with
    formats unchecked "" is both."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {"anyOf" if key == "oneOf" else key: _json_schema(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def assert_documented(schema, call, response):
    operation = next(op for _, _, op in operations(schema) if op["operationId"] == call.name)
    documented = operation["responses"].get(str(response.status_code))
    assert documented is not None, (call.name, response.status_code, response.content)
    content = documented.get("content", {})
    media = response.get("Content-Type", "").split(";")[0]
    if media != "application/json" and media in content:
        return  # a download (an export): documented as binary
    if "application/json" not in content:
        assert response.status_code == 204 or "*/*" in content
        return
    body_schema = {
        **_json_schema(content["application/json"]["schema"]),
        "components": _json_schema(schema["components"]),
    }
    jsonschema.validate(response.json(), body_schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("call", CALLS, ids=lambda call: call.name)
def test_every_operation_answers_as_documented(call, schema, alice, bob, settings):
    ids = world_ids(alice, "alice-hook")
    # The owner: success, with the documented body.
    response = call.send(client_of(alice), ids)
    assert 200 <= response.status_code < 300, response.content
    assert_documented(schema, call, response)
    # Invalid input where there is input, someone else, no key, an expired key.
    ids = world_ids(alice, "alice-again")
    if call.body:
        junk = {name: {"not": "this"} for name in call.body(ids)}
        response = getattr(client_of(alice), call.method)(call.url(ids), junk, format="json")
        assert response.status_code == 400
        assert_documented(schema, call, response)
    assert_documented(schema, call, call.send(client_of(bob), ids))
    assert_documented(schema, call, call.send(client_with(None), ids))
    expired = key_for(alice, expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert_documented(schema, call, call.send(client_with(expired), ids))
    # Over the throttle.
    settings.API_THROTTLE_RATE = "1/min"
    client = client_of(alice)
    client.get("/api/v1/webhooks/")
    response = call.send(client, ids)
    assert response.status_code == 429
    assert_documented(schema, call, response)
