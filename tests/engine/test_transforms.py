"""Target transforms (jq): what a receiver is sent, run in worker processes with a
time and a memory limit, against real stored events and a real receiver."""

import json

import pytest
import standardwebhooks
from django.core.exceptions import ValidationError

from deliveries.models import Delivery, DeliveryResult
from deliveries.transforms import workers
from tests.support.engines import make_engine, pump, started_engine, store

pytestmark = pytest.mark.django_db

PUSH = json.dumps(
    {"ref": "refs/heads/main", "repository": {"full_name": "acme/api"}, "pusher": {"name": "ann"}}
).encode()


def finished(n):
    return lambda: Delivery.objects.filter(status__in=Delivery.FINISHED).count() >= n


def deliver(entrypoint, target, **store_kwargs):
    """Store one event and run the engine until the target's delivery ends."""
    engine = started_engine()
    store(entrypoint, **store_kwargs)
    pump(engine, finished(1))
    return Delivery.objects.get(target=target)


def test_a_transform_reshapes_body_headers_and_query_and_the_signature_covers_it(
    entrypoint, make_target, sink
):
    target = make_target(
        url=sink.url("/t"),
        transform="{body: {repo: .body.repository.full_name, by: .body.pusher.name}, "
        'headers: {"X-Kind": .event.type, "X-Drop-Me": null}, query: "from=webhooker"}',
    )
    delivery = deliver(
        entrypoint,
        target,
        body=PUSH,
        headers=[["Content-Type", "application/json"], ["X-Drop-Me", "1"]],
    )

    assert delivery.status == "delivered"
    (received,) = sink.wait_for(1)
    assert json.loads(received.body) == {"repo": "acme/api", "by": "ann"}
    assert received.headers["Content-Type"] == "application/json"
    assert received.headers["X-Kind"] == ""  # the event's type: none without a preset
    assert "X-Drop-Me" not in received.headers
    assert received.path == "/t?from=webhooker"
    standardwebhooks.Webhook(target.signing_secret).verify(
        received.body, received.headers, json_parse=False
    )


def test_a_string_body_is_sent_as_it_is(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/s"), transform='{body: "ref=\\(.body.ref)"}')
    deliver(entrypoint, target, body=PUSH, content_type="text/plain")
    (received,) = sink.wait_for(1, "/s")
    assert received.body == b"ref=refs/heads/main"
    assert received.headers["Content-Type"] == "text/plain"


@pytest.mark.parametrize("program", ["null", 'select(.body.ref == "refs/heads/dev")'])
def test_null_or_no_value_drops_the_event_without_an_attempt(
    entrypoint, make_target, sink, program
):
    target = make_target(url=sink.url("/d"), transform=program)
    delivery = deliver(entrypoint, target, body=PUSH)

    assert (delivery.status, delivery.reason) == ("filtered", "dropped by transform")
    assert delivery.attempts == 0
    assert not DeliveryResult.objects.exists()
    assert sink.requests("/d") == []


def test_filters_run_before_the_transform(entrypoint, make_target, sink):
    target = make_target(
        url=sink.url("/f"),
        filters=[{"source": "json", "name": "ref", "op": "equals", "value": "refs/heads/dev"}],
        transform='error("never run")',
    )
    delivery = deliver(entrypoint, target, body=PUSH)
    assert (delivery.status, delivery.reason) == ("filtered", "the target's filters did not match")


@pytest.mark.parametrize(
    ("program", "error"),
    [
        ("last(range(1e15))", "the transform ran longer than 0.5 s"),
        ('reduce range(40) as $i ("x"; . + .)', "the transform needed more than 128 MB"),
        ('error("no repo")', "no repo"),
        (".body.repository, .body.pusher", "more than one value"),
        ("{text: .body.ref}", "unknown keys text"),
        ("[1]", "yielded a list"),
    ],
)
def test_a_failing_transform_fails_its_delivery_at_once_and_the_next_ones_go_on(
    entrypoint, make_target, sink, settings, program, error
):
    settings.DELIVERY_TRANSFORM_TIMEOUT = 0.5
    settings.DELIVERY_TRANSFORM_MEMORY = 128
    bad = make_target(
        url=sink.url("/bad"), transform=program, max_retries=5, name="bad", ordered=False
    )
    other = make_target(url=sink.url("/other"), transform="{}", name="other")
    engine = started_engine()
    store(entrypoint, body=PUSH)
    pump(engine, finished(2))

    failed = Delivery.objects.get(target=bad)
    assert (failed.status, failed.attempts) == ("failed", 1)  # no retries
    (result,) = DeliveryResult.objects.filter(delivery=failed)
    assert result.error.startswith("transform failed: ")
    assert error in result.error
    assert sink.requests("/bad") == []
    assert Delivery.objects.get(target=other).status == "delivered"

    # The next event of the same target gets its own run (a new worker after a kill).
    bad.transform = "{}"
    bad.save()
    engine.refresh_targets(force=True)
    store(entrypoint, body=PUSH)
    pump(engine, finished(4))
    assert Delivery.objects.filter(target=bad, status="delivered").count() == 1
    assert len(sink.requests("/bad")) == 1


def test_a_transform_changed_between_two_attempts_applies_to_the_second(
    entrypoint, make_target, sink
):
    sink.respond("/r", 500)
    target = make_target(url=sink.url("/r"), transform="{body: {n: 1}}", max_retries=3)
    engine = make_engine()
    engine.recover_once(at_start=True)
    store(entrypoint, body=PUSH)
    pump(engine, lambda: DeliveryResult.objects.count() == 1)

    target.transform = "{body: {n: 2}}"
    target.save()
    engine.refresh_targets(force=True)
    pump(engine, finished(1))

    first, second = sink.requests("/r")
    assert (json.loads(first.body), json.loads(second.body)) == ({"n": 1}, {"n": 2})


def test_a_syntax_error_is_a_field_error_with_jqs_message(make_target):
    target = make_target(url="http://example.com/x")
    target.transform = ".body |"
    with pytest.raises(ValidationError) as caught:
        target.full_clean()
    assert "syntax error" in caught.value.message_dict["transform"][0]


def test_workers_follow_the_settings(settings):
    settings.DELIVERY_TRANSFORM_TIMEOUT = 0.25
    assert workers().timeout == 0.25
    assert workers() is workers()


def test_a_program_reads_nothing_of_the_engines_environment(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/env"), transform="{body: {env: $ENV}}")
    assert deliver(entrypoint, target, body=PUSH).status == "delivered"
    (received,) = sink.wait_for(1, "/env")
    # Only what Python sets for itself (PEP 538's locale coercion).
    assert set(json.loads(received.body)["env"]) <= {"LC_CTYPE"}


def test_modules_cannot_be_imported(make_target):
    target = make_target(url="http://example.com/x")
    target.transform = 'import "secrets" as $s; .'
    with pytest.raises(ValidationError) as caught:
        target.full_clean()
    assert "transform" in caught.value.message_dict
