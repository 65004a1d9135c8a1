"""Inbound verification: each preset against requests signed as its provider
documents signing them (built here by hand from the public docs, never with
webhooker's own code), and what a rejection leaves behind."""

import base64
import datetime
import hashlib
import hmac
import time
from dataclasses import dataclass

import pytest
import standardwebhooks
from django.core.exceptions import ValidationError

from deliveries import metrics
from deliveries.models import Entrypoint, Event, Rejection
from tests.support.metrics import value

pytestmark = pytest.mark.django_db

BODY = b'{"id": "evt_1", "action": "opened", "n": 42}'
SW_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER_SW_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()


def hex_mac(secret, data, algorithm=hashlib.sha256):
    return hmac.new(secret.encode(), data, algorithm).hexdigest()


def github(secret, body, ts):
    # docs.github.com: "Validating webhook deliveries"
    return {"X-Hub-Signature-256": "sha256=" + hex_mac(secret, body)}


def stripe(secret, body, ts):
    # docs.stripe.com: "Verify signatures manually": signed_payload = t + "." + body
    return {"Stripe-Signature": f"t={ts},v1={hex_mac(secret, f'{ts}.'.encode() + body)}"}


def shopify(secret, body, ts):
    # shopify.dev: "Verify webhooks": base64 of the HMAC-SHA256 digest
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return {"X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode()}


def slack(secret, body, ts):
    # api.slack.com: "Verifying requests from Slack": v0:timestamp:body
    return {
        "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": "v0=" + hex_mac(secret, f"v0:{ts}:".encode() + body),
    }


def standard_webhooks(secret, body, ts):
    # The reference library signs as the spec says.
    when = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek"
    signature = standardwebhooks.Webhook(secret).sign(msg_id, when, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": signature,
    }


def svix(secret, body, ts):
    """Standard Webhooks as senders built on Svix send it: svix-* header names."""
    return {
        name.replace("webhook-", "svix-"): value
        for name, value in standard_webhooks(secret, body, ts).items()
    }


def generic_sha512_base64(secret, body, ts):
    digest = hmac.new(secret.encode(), body, hashlib.sha512).digest()
    return {"X-Signature": "sha512=" + base64.b64encode(digest).decode()}


def generic_sha1_hex(secret, body, ts):
    return {"X-Hook-Sig": hex_mac(secret, body, hashlib.sha1).upper()}


def basic(secret, body, ts):
    return {"Authorization": "Basic " + base64.b64encode(f"hooks:{secret}".encode()).decode()}


def token(secret, body, ts):
    return {"X-Webhook-Token": secret}


@dataclass
class Case:
    preset: str
    sign: object
    config: dict
    secret: str
    wrong_secret: str
    timestamped: bool = False
    # Whether the body is signed (Basic auth and a token header do not cover it).
    covers_body: bool = True

    def __str__(self):
        return self.sign.__name__


CASES = [
    Case("github", github, {}, "It's a Secret to Everybody", "wrong"),
    Case("stripe", stripe, {}, "whsec_test_secret", "whsec_other", timestamped=True),
    Case("shopify", shopify, {}, "shpss_0123456789", "wrong"),
    Case("slack", slack, {}, "8f742231b10e8888abcd99yyyzzz85a5", "wrong", timestamped=True),
    Case("standard_webhooks", standard_webhooks, {}, SW_SECRET, OTHER_SW_SECRET, timestamped=True),
    Case("standard_webhooks", svix, {}, SW_SECRET, OTHER_SW_SECRET, timestamped=True),
    Case(
        "hmac",
        generic_sha512_base64,
        {"header": "X-Signature", "algorithm": "sha512", "encoding": "base64", "prefix": "sha512="},
        "s3cret",
        "wrong",
    ),
    Case("hmac", generic_sha1_hex, {"header": "X-Hook-Sig", "algorithm": "sha1"}, "s3cret", "x"),
    Case("basic", basic, {"username": "hooks"}, "pa:ss word", "wrong", covers_body=False),
    Case("token", token, {"header": "X-Webhook-Token"}, "tok_123", "tok_124", covers_body=False),
]


def configure(entrypoint, case):
    key = "password" if case.preset == "basic" else "secret"
    entrypoint.verification = case.preset
    entrypoint.verification_config = {**case.config, key: case.secret}
    entrypoint.full_clean()
    entrypoint.save()
    return entrypoint


def post(client, entrypoint, body, headers):
    return client.generic(
        "POST",
        f"/webhook/{entrypoint.code}",
        body,
        content_type="application/json",
        headers=headers,
    )


@pytest.fixture(params=CASES, ids=str)
def case(request):
    return request.param


def assert_rejected(response, entrypoint):
    assert response.status_code == 401
    assert response.json()["error"].startswith("verification failed: ")
    assert Event.objects.count() == 0
    assert Rejection.objects.filter(entrypoint=entrypoint).exists()


def test_a_correctly_signed_request_is_accepted(client, entrypoint, case):
    configure(entrypoint, case)
    response = post(client, entrypoint, BODY, case.sign(case.secret, BODY, int(time.time())))
    assert response.status_code == 200, response.content
    event = Event.objects.get()
    assert bytes(event.body) == BODY
    assert not Rejection.objects.exists()


def test_a_wrong_signature_is_rejected(client, entrypoint, case):
    configure(entrypoint, case)
    headers = case.sign(case.wrong_secret, BODY, int(time.time()))
    assert_rejected(post(client, entrypoint, BODY, headers), entrypoint)


def test_a_missing_header_is_rejected(client, entrypoint, case):
    configure(entrypoint, case)
    signed = case.sign(case.secret, BODY, int(time.time()))
    for name in signed:
        headers = {k: v for k, v in signed.items() if k != name}
        response = post(client, entrypoint, BODY, headers)
        assert_rejected(response, entrypoint)
        assert name.lower() in response.json()["error"].lower()


@pytest.mark.parametrize("case", [c for c in CASES if c.timestamped], ids=str)
def test_a_stale_timestamp_is_rejected(client, entrypoint, case):
    configure(entrypoint, case)
    for offset in (-301, -3600, 3600):  # too old, and a sender's clock far ahead
        headers = case.sign(case.secret, BODY, int(time.time()) + offset)
        response = post(client, entrypoint, BODY, headers)
        assert_rejected(response, entrypoint)
        assert "tolerance" in response.json()["error"]


# Basic auth and a token header prove the sender, not the body.
@pytest.mark.parametrize("case", [c for c in CASES if c.covers_body], ids=str)
def test_a_body_changed_by_one_byte_is_rejected(client, entrypoint, case):
    configure(entrypoint, case)
    headers = case.sign(case.secret, BODY, int(time.time()))
    changed = BODY.replace(b"42", b"43")
    assert len(changed) == len(BODY) and changed != BODY
    assert_rejected(post(client, entrypoint, changed, headers), entrypoint)


def test_the_reason_never_contains_the_expected_signature(client, entrypoint):
    configure(entrypoint, CASES[0])
    response = post(client, entrypoint, BODY, {"X-Hub-Signature-256": "sha256=00"})
    expected = hex_mac(CASES[0].secret, BODY)
    assert response.json() == {"error": "verification failed: signature mismatch"}
    assert expected not in response.content.decode()
    assert Rejection.objects.get().reason == "signature mismatch"


def test_basic_auth_rejection_carries_a_challenge(client, entrypoint):
    configure(entrypoint, next(c for c in CASES if c.preset == "basic"))
    response = post(client, entrypoint, BODY, {})
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Basic ")


def test_rejections_are_kept_with_time_address_and_reason_100_at_most(client, entrypoint):
    configure(entrypoint, CASES[0])
    other = Entrypoint.objects.create(webhook=entrypoint.webhook, description="other")
    configure(other, CASES[0])
    post(client, other, BODY, {})
    for n in range(Rejection.KEEP + 5):
        client.generic(
            "POST",
            f"/webhook/{entrypoint.code}",
            BODY,
            content_type="application/json",
            headers={"X-Hub-Signature-256": f"sha256={n}"},
            REMOTE_ADDR="203.0.113.9",
        )
    kept = Rejection.objects.filter(entrypoint=entrypoint)
    assert kept.count() == Rejection.KEEP
    newest = kept.first()
    assert (newest.reason, newest.remote_addr) == ("signature mismatch", "203.0.113.9")
    assert newest.created_at is not None
    # The five oldest went, the newest 100 stayed; the other entrypoint's is its own.
    first_ids = sorted(kept.values_list("id", flat=True))
    assert first_ids == list(range(first_ids[0], first_ids[0] + Rejection.KEEP))
    assert Rejection.objects.filter(entrypoint=other).count() == 1
    assert Event.objects.count() == 0


def test_rejections_are_counted_per_entrypoint(client, entrypoint):
    configure(entrypoint, CASES[0])
    for _ in range(3):
        post(client, entrypoint, BODY, {})
    text = metrics.render().decode()
    assert value(text, "webhooker_events_rejected_total", entrypoint=str(entrypoint.code)) == 3


def test_a_config_written_past_validation_rejects_everything(client, entrypoint):
    Entrypoint.objects.filter(pk=entrypoint.pk).update(
        verification="github", verification_config={}
    )
    response = post(client, entrypoint, BODY, github("", BODY, 0))
    assert response.status_code == 401
    assert "misconfigured" in response.json()["error"]
    assert Event.objects.count() == 0


@pytest.mark.parametrize(
    ("preset", "config", "field"),
    [
        ("github", {}, "secret"),
        ("stripe", {"secret": ""}, "secret"),
        ("standard_webhooks", {"secret": "whsec_not-base64!"}, "secret"),
        ("standard_webhooks", {"secret": "whsec_" + base64.b64encode(b"x" * 8).decode()}, "secret"),
        ("hmac", {"secret": "s", "header": "X-Sig", "algorithm": "md5"}, "algorithm"),
        ("hmac", {"secret": "s", "header": "X-Sig", "encoding": "base32"}, "encoding"),
        ("hmac", {"secret": "s", "header": "Bad Header"}, "header"),
        ("basic", {"username": "a:b", "password": "p"}, "username"),
        ("token", {"secret": "t"}, "header"),
        ("github", {"secret": "s", "surprise": 1}, "__all__"),
    ],
)
def test_a_bad_config_is_a_field_error_never_a_traceback(entrypoint, preset, config, field):
    entrypoint.verification = preset
    entrypoint.verification_config = config
    with pytest.raises(ValidationError) as caught:
        entrypoint.full_clean()
    assert "verification_config" in caught.value.message_dict
    assert field in str(caught.value) or field == "__all__"


def test_an_unknown_preset_is_a_field_error(entrypoint):
    entrypoint.verification = "carrier-pigeon"
    with pytest.raises(ValidationError) as caught:
        entrypoint.full_clean()
    assert "verification" in caught.value.message_dict


def test_svix_senders_event_ids_are_read_from_svix_id(client, entrypoint):
    case = next(c for c in CASES if c.sign is svix)
    configure(entrypoint, case)
    response = post(client, entrypoint, BODY, case.sign(case.secret, BODY, int(time.time())))
    assert response.status_code == 200
    assert Event.objects.get().provider_id == "msg_p5jXN8AQM9LWM0D4loKWxJek"
