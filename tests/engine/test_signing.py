"""Outbound signing: every http delivery carries Standard Webhooks headers, checked
here with the `standardwebhooks` package as a receiver would check them."""

import base64
import datetime
import logging

import pytest
import standardwebhooks
from django.utils import timezone

from deliveries import signing
from deliveries.models import Delivery, DeliveryResult, Target
from tests.support.clock import FakeClock
from tests.support.engines import attempt_one, make_engine, pump, started_engine, store

pytestmark = pytest.mark.django_db


def verifies(secret, received) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(received.body, received.headers, json_parse=False)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def test_new_targets_get_their_own_secret_in_the_standard_format(make_target):
    a, b = make_target(url="http://example.com/a"), make_target(url="http://example.com/b")
    for target in (a, b):
        assert target.signing is True
        assert target.signing_secret.startswith("whsec_")
        assert len(base64.b64decode(target.signing_secret.removeprefix("whsec_"))) == 32
    assert a.signing_secret != b.signing_secret


def test_the_sink_verifies_every_delivery(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/signed"))
    engine = started_engine()
    store(entrypoint, body=b'{"n": 1}')
    # Not valid UTF-8: signed over the exact bytes, not over a decoded text.
    store(entrypoint, body=b"\xff\xfe binary \x00", content_type="application/octet-stream")
    pump(engine, lambda: not Delivery.objects.unfinished().exists())
    received = sink.requests("/signed")
    assert len(received) == 2
    assert verifies(target.signing_secret, received[0])
    # The package verifies text only; the same check by hand for the binary body.
    binary = received[1]
    key = signing.secret_key(target.signing_secret)
    expected = signing.signature(
        key, binary.headers["webhook-id"], int(binary.headers["webhook-timestamp"]), binary.body
    )
    assert binary.headers["webhook-signature"] == expected
    assert not verifies(make_target(url="http://example.com/x").signing_secret, received[0])


def test_webhook_id_is_the_same_across_retries_and_a_redelivery(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/flaky"), max_retries=3)
    sink.respond("/flaky", 500, 500, 500, 200)
    engine = started_engine()
    [event] = store(entrypoint)
    pump(engine, lambda: Delivery.objects.get().status == "delivered")
    Delivery.objects.all().redeliver()
    pump(engine, lambda: Delivery.objects.get().status == "delivered")

    received = sink.requests("/flaky")
    assert len(received) == 5  # the first attempt, three retries, the redelivery
    ids = {r.headers["webhook-id"] for r in received}
    assert ids == {signing.message_id(event.code, target.id)}
    assert all(verifies(target.signing_secret, r) for r in received)


def test_rotation_signs_with_both_secrets_during_the_overlap_only(
    entrypoint, make_target, sink, settings
):
    settings.SIGNING_ROTATION_OVERLAP = 3600
    target = make_target(url=sink.url("/rot"))
    old = target.signing_secret
    engine = attempt_one(entrypoint)

    new = target.rotate_signing_secret()
    assert new != old and target.signing_secret == new
    assert target.previous_signing_secret == old
    engine.refresh_targets(force=True)  # not wait for the engine's next look
    attempt_one(entrypoint, engine)

    # The overlap ends: the rotation is now older than SIGNING_ROTATION_OVERLAP.
    past = timezone.now() - datetime.timedelta(seconds=3601)
    Target.objects.filter(pk=target.pk).update(secret_rotated_at=past, updated_at=timezone.now())
    engine.refresh_targets(force=True)
    attempt_one(entrypoint, engine)

    before, during, after = sink.wait_for(3, "/rot")
    assert verifies(old, before)
    assert not verifies(new, before)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert verifies(old, during)
    assert verifies(new, during)
    assert verifies(new, after)
    assert not verifies(old, after)
    assert len(after.headers["webhook-signature"].split(" ")) == 1


def test_an_attempt_after_rotate_secret_answers_is_signed_with_the_new_secret(
    entrypoint, make_target, sink, monkeypatch, django_capture_on_commit_callbacks
):
    """The race found from outside: an engine whose last look at its targets came
    just before the rotation committed signed the next attempts with the old
    secret alone, until its next look (up to half a second later). The rotation
    answers once no engine may attempt with a row read before it."""
    clock = FakeClock()
    # What the answer waits for, on the engine's clock.
    monkeypatch.setattr(
        Target,
        "until_engines_see_changes",
        staticmethod(lambda: setattr(clock, "now", clock.now + Target.ROTATION_SEEN_AFTER)),
    )
    target = make_target(url=sink.url("/rot"))
    old = target.signing_secret
    engine = attempt_one(entrypoint, make_engine(clock=clock))  # its look at the target
    store(entrypoint)
    engine.intake_once()  # claimed before the rotation, attempted after its answer
    with django_capture_on_commit_callbacks(execute=True):  # its commit, then its wait
        new = target.rotate_signing_secret()
    assert engine.process_one()
    _, after = sink.wait_for(2, "/rot")
    assert verifies(new, after) and verifies(old, after)  # both, in the overlap


def test_signing_off_sends_no_signature_headers(entrypoint, make_target, sink):
    make_target(url=sink.url("/plain"), signing=False)
    attempt_one(entrypoint)
    [got] = sink.requests("/plain")
    assert not {"webhook-id", "webhook-timestamp", "webhook-signature"} & {
        name.lower() for name in got.headers
    }


def test_a_senders_own_signature_headers_are_replaced(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/relay"))
    forged = [
        ["Content-Type", "application/json"],
        ["Webhook-Id", "msg_from_the_sender"],
        ["Webhook-Timestamp", "1"],
        ["Webhook-Signature", "v1,c2VuZGVy"],
    ]
    attempt_one(entrypoint, headers=forged)
    [got] = sink.requests("/relay")
    assert got.headers["webhook-id"].startswith("msg_")
    assert got.headers["webhook-id"] != "msg_from_the_sender"
    assert "c2VuZGVy" not in got.headers["webhook-signature"]
    assert verifies(target.signing_secret, got)


def test_secrets_are_never_logged_nor_recorded_with_the_attempt(
    entrypoint, make_target, sink, caplog
):
    target = make_target(url=sink.url("/down"), max_retries=1)
    target.rotate_signing_secret()
    sink.always("/down", 500)
    caplog.set_level(logging.DEBUG)
    engine = make_engine()
    engine.recover_once(at_start=True)
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.get().status == "failed")

    secrets = [target.signing_secret, target.previous_signing_secret]
    # The message and every attribute of each record, extra= fields included.
    logged = "\n".join(f"{r.getMessage()} {vars(r)!r}" for r in caplog.records)
    # Every column of every attempt record, whatever the record comes to hold.
    recorded = " ".join(
        str(getattr(r, f.attname)) for r in DeliveryResult.objects.all() for f in r._meta.fields
    )
    assert DeliveryResult.objects.count() == 2
    for secret in secrets:
        key = secret.removeprefix("whsec_")
        assert key not in logged
        assert key not in recorded
