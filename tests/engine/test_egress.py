"""Egress for receivers inside companies (issue 29): mutual TLS against a local TLS
server that requires a client certificate, OAuth2 client credentials against a local
token endpoint, Basic auth, and a local forward proxy that records what it
forwarded — each with the engine's real HTTP client."""

import base64
import datetime
import http.client
import http.server
import json
import urllib.parse

import pytest
import trustme
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult, Target
from deliveries.targets import egress
from tests.support.admin import client_for
from tests.support.egress import (
    answer,
    client_pems,
    deliver,
    receiver,
    requiring_client_certificates,
    run,
)
from tests.support.engines import make_engine, store

pytestmark = pytest.mark.django_db

NOW = datetime.datetime.now(datetime.UTC)


# --- mutual TLS ----------------------------------------------------------------


def test_mtls_with_the_right_certificate_is_delivered(entrypoint, webhook, servers, ca):
    port, seen = receiver(servers, requiring_client_certificates(ca))
    cert, key = client_pems(ca)
    result = deliver(
        entrypoint,
        webhook,
        url=f"https://127.0.0.1:{port}/in",
        tls_client_cert=cert,
        tls_client_key=key,
        tls_ca_cert=ca.cert_pem.bytes().decode(),  # the receiver's private CA
    )
    assert result.success, result.error
    assert len(seen.seen) == 1


@pytest.mark.parametrize("presented", ["none", "another CA's"])
def test_mtls_without_the_right_certificate_fails_in_words(
    entrypoint, webhook, servers, ca, presented
):
    port, seen = receiver(servers, requiring_client_certificates(ca))
    config = {"url": f"https://127.0.0.1:{port}/in", "tls_ca_cert": ca.cert_pem.bytes().decode()}
    if presented != "none":
        config["tls_client_cert"], config["tls_client_key"] = client_pems(trustme.CA())
    result = deliver(entrypoint, webhook, **config)
    assert not result.success and result.failure in ("tls", "connection")
    first = result.error.split("\n", 1)[0]
    assert "TLS" in first or "certificate" in first or "connection" in first, first
    assert seen.seen == []


def checked(**config):
    target = Target(name="t", config={"url": "https://example.com/in", **config})
    target.clean_fields(exclude=["webhook"])
    return target.config


def test_a_client_certificate_is_checked_when_saved(ca):
    cert, key = client_pems(ca)
    _, other_key = client_pems(ca)
    assert checked(tls_client_cert=cert, tls_client_key=key)["tls_client_cert"] == cert.strip()
    cases = {
        "does not match": {"tls_client_cert": cert, "tls_client_key": other_key},
        "needs its private key": {"tls_client_cert": cert},
        "not a PEM certificate": {"tls_client_cert": "nonsense", "tls_client_key": key},
        "not a PEM private key": {"tls_client_cert": cert, "tls_client_key": "nonsense"},
        "expired on": dict(
            zip(
                ("tls_client_cert", "tls_client_key"),
                client_pems(
                    ca,
                    not_before=NOW - datetime.timedelta(days=9),
                    not_after=NOW - datetime.timedelta(days=1),
                ),
                strict=True,
            )
        ),
        "https:// URLs only": {
            "url": "http://example.com/in",
            "tls_ca_cert": ca.cert_pem.bytes().decode(),
        },
    }
    for words, config in cases.items():
        with pytest.raises(ValidationError, match=words):
            checked(**config)


def test_a_certificate_near_its_end_is_warned_about_on_the_target_page(alice, ca):
    from deliveries.models import Webhook

    cert, key = client_pems(ca, not_after=NOW + datetime.timedelta(days=10))
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(
        webhook=hook,
        name="t",
        config={"url": "https://example.com/in", "tls_client_cert": cert, "tls_client_key": key},
    )
    assert "expires on" in egress.expiry_warning(target.config)
    page = (
        client_for(alice)
        .get(reverse("admin:deliveries_target_change", args=[target.pk]))
        .content.decode()
    )
    assert "client certificate expires on" in page
    assert key.splitlines()[1] not in page  # the key is never shown back


# --- OAuth2 client credentials ----------------------------------------------------


class TokenEndpoint(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    asked: list
    answer: dict  # {"status", "body"} overrides; else a new token
    life = 3600

    def do_POST(self):
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        _scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
        user, _, password = base64.b64decode(credentials).decode().partition(":")
        self.asked.append({"form": form, "client": user, "secret": password})
        if password != "s3cr3t-client":
            status, body = 401, {"error": "invalid_client", "error_description": "bad credentials"}
        else:
            status, body = 200, {"access_token": f"tok-{len(self.asked)}", "expires_in": self.life}
        answer(self, status, json.dumps(body).encode(), "application/json")

    def log_message(self, *args):
        pass


@pytest.fixture
def oauth(servers, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(egress, "tokens", egress.Tokens(clock=lambda: now[0]))
    endpoint = type("T", (TokenEndpoint,), {"asked": []})
    server = servers(endpoint)
    port, seen = receiver(servers)

    def target(webhook, secret="s3cr3t-client", **extra):
        return Target.objects.create(
            webhook=webhook,
            name="oauth",
            max_retries=0,
            config={
                "url": f"http://127.0.0.1:{port}/in",
                "oauth_token_url": f"http://127.0.0.1:{server.server_address[1]}/token",
                "oauth_client_id": "webhooker",
                "oauth_client_secret": secret,
                "oauth_scope": "events:write",
                **extra,
            },
        )

    return target, endpoint, seen, now


def test_a_token_is_fetched_once_and_sent_until_it_expires(entrypoint, webhook, oauth):
    make, endpoint, seen, now = oauth
    make(webhook)
    run(entrypoint, n=3)
    assert len(endpoint.asked) == 1
    assert endpoint.asked[0]["form"] == {
        "grant_type": ["client_credentials"],
        "scope": ["events:write"],
    }
    assert endpoint.asked[0]["client"] == "webhooker"
    assert [r["authorization"] for r in seen.seen] == ["Bearer tok-1"] * 3
    # Its hour, less a minute's margin, passes: the next attempt takes a new one.
    now[0] += 3600 - 61
    run(entrypoint)
    assert len(endpoint.asked) == 1
    now[0] += 2
    run(entrypoint)
    assert len(endpoint.asked) == 2 and seen.seen[-1]["authorization"] == "Bearer tok-2"


def test_a_refused_token_is_fetched_again_once(entrypoint, webhook, oauth):
    make, endpoint, seen, _now = oauth
    make(webhook)
    run(entrypoint)
    seen.refused.add("Bearer tok-1")  # revoked at the receiver
    run(entrypoint)
    assert Delivery.objects.filter(status="delivered").count() == 2
    assert [r["authorization"] for r in seen.seen] == [
        "Bearer tok-1",
        "Bearer tok-1",
        "Bearer tok-2",
    ]
    seen.refused.add("Bearer tok-2")
    seen.refused.add("Bearer tok-3")
    run(entrypoint)  # refused again after the one refresh: the attempt fails, 401
    result = DeliveryResult.objects.order_by("-id").first()
    assert result.status_code == 401 and len(endpoint.asked) == 3


def test_a_bad_client_secret_fails_the_attempt_in_words_never_naming_it(entrypoint, webhook, oauth):
    make, _endpoint, seen, _now = oauth
    make(webhook, secret="wrong-s3cr3t")
    run(entrypoint)
    result = DeliveryResult.objects.get()
    assert result.error == "OAuth2: token endpoint answered 401: invalid_client: bad credentials"
    assert "wrong-s3cr3t" not in result.error and result.failure == "status"
    assert seen.seen == []


def test_a_token_endpoint_the_guard_refuses_is_never_asked(
    entrypoint, webhook, oauth, dns, settings
):
    make, endpoint, _seen, _now = oauth
    dns["idp.internal"] = ["10.1.2.3"]
    target = make(webhook)
    target.config["oauth_token_url"] = "http://idp.internal/token"
    Target.objects.filter(pk=target.pk).update(config=target.config)
    run(entrypoint)
    result = DeliveryResult.objects.get()
    assert result.error.startswith("OAuth2: token endpoint") and "blocked" in result.error
    assert result.failure == "blocked" and endpoint.asked == []


# --- Basic auth -----------------------------------------------------------------


def test_basic_auth_fields(entrypoint, webhook, servers):
    port, seen = receiver(servers)
    result = deliver(
        entrypoint,
        webhook,
        url=f"http://127.0.0.1:{port}/in",
        basic_username="hook",
        basic_password="pä55",
    )
    assert result.success
    assert (
        seen.seen[0]["authorization"] == "Basic " + base64.b64encode("hook:pä55".encode()).decode()
    )
    assert ["Authorization", "••••••••"] in result.request_headers
    with pytest.raises(ValidationError, match="not both"):
        checked(url="https://u:p@example.com/", basic_username="hook")


# --- forward proxy ----------------------------------------------------------------


def test_every_delivery_goes_through_delivery_proxy(entrypoint, webhook, servers, proxy, settings):
    port, forwarded = proxy
    # Credentials past ASCII in UTF-8, as a target's Basic auth (RFC 7617).
    settings.DELIVERY_PROXY = f"http://ops:pr0xy-%C3%BC@127.0.0.1:{port}"
    target_port, seen = receiver(servers)
    result = deliver(entrypoint, webhook, url=f"http://127.0.0.1:{target_port}/in")
    assert result.success, result.error
    assert forwarded == [
        {
            "method": "POST",
            "target": f"http://127.0.0.1:{target_port}/in",
            "auth": "Basic " + base64.b64encode("ops:pr0xy-ü".encode()).decode(),
        }
    ]
    assert len(seen.seen) == 1


def test_https_goes_through_a_targets_own_proxy_with_connect(
    entrypoint, webhook, servers, proxy, ca
):
    port, forwarded = proxy

    def configure(context):
        ca.issue_cert("127.0.0.1").configure_cert(context)

    target_port, seen = receiver(servers, configure)
    result = deliver(
        entrypoint,
        webhook,
        url=f"https://127.0.0.1:{target_port}/in",
        tls_ca_cert=ca.cert_pem.bytes().decode(),
        proxy=f"http://ops:pr0xy@127.0.0.1:{port}",
    )
    assert result.success, result.error
    auth = "Basic " + base64.b64encode(b"ops:pr0xy").decode()
    assert forwarded == [{"method": "CONNECT", "target": f"127.0.0.1:{target_port}", "auth": auth}]
    assert "proxy-authorization" not in seen.seen[0]  # never inside the tunnel


def test_a_blocked_destination_never_reaches_the_proxy(entrypoint, webhook, proxy, settings, dns):
    port, forwarded = proxy
    settings.DELIVERY_PROXY = f"http://127.0.0.1:{port}"
    dns["intranet.example.com"] = ["10.9.8.7"]
    result = deliver(entrypoint, webhook, url="http://intranet.example.com/admin")
    assert not result.success and result.failure == "blocked"
    assert "10.9.8.7" in result.error
    assert forwarded == []


def test_an_expiring_certificate_is_alerted_once_a_day(entrypoint, webhook, servers, ca, alice):
    from deliveries.models import Alert

    cert, key = client_pems(ca, not_after=NOW + datetime.timedelta(days=5))
    port, _ = receiver(servers)
    Target.objects.create(
        webhook=webhook,
        name="t",
        max_retries=0,
        config={
            "url": f"https://127.0.0.1:{port}/in",
            "tls_client_cert": cert,
            "tls_client_key": key,
        },
    )
    clock = [0.0]
    engine = make_engine(clock=lambda: clock[0])
    engine.recover_once(at_start=True)
    store(entrypoint)
    engine.intake_once()  # the engine knows the target now
    engine.alert_once()
    engine.alert_once()
    assert Alert.objects.count() == 1
    Alert.objects.update(created_at=timezone.now() - datetime.timedelta(days=1, hours=1))
    clock[0] += 86_400 + 3600
    engine.alert_once()
    alerts = list(Alert.objects.values_list("kind", "message"))
    assert len(alerts) == 2  # at once, then a day later (not at every check)
    assert all(kind == "certificate" and "expires on" in message for kind, message in alerts)
