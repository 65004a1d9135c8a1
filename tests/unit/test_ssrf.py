"""Targets may not reach private, loopback, link-local or other internal addresses."""

import pytest
from django.core.exceptions import ValidationError

from deliveries import ssrf
from deliveries.models import Delivery, DeliveryResult, Target
from tests.support.engines import attempt_one

BLOCKED = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "100.64.0.1",
    "100.127.255.254",
    "169.254.169.254",
    "169.254.1.1",
    "224.0.0.1",
    "239.255.255.250",
    "ff02::1",
    "240.0.0.1",
    "255.255.255.255",
    "0.0.0.0",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "2002:a00:1::1",  # 6to4 around 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 around 169.254.169.254
    "192.0.2.1",  # documentation
]
ALLOWED = ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.fixture(autouse=True)
def nothing_allowed(settings):
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = []


@pytest.mark.parametrize("address", BLOCKED)
def test_blocked_classes(address):
    assert ssrf.refusal(address)


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_pass(address):
    assert ssrf.refusal(address) is None


def literal_url(address):
    return f"http://[{address}]/hook" if ":" in address else f"http://{address}/hook"


@pytest.mark.django_db
@pytest.mark.parametrize("address", BLOCKED)
def test_save_refuses_literal_and_named_internal_addresses(webhook, dns, address):
    for url in (literal_url(address), "http://internal.example.net/hook"):
        dns["internal.example.net"] = [address]
        target = Target(webhook=webhook, name="t", type="http", config={"url": url})
        with pytest.raises(ValidationError) as exc:
            target.full_clean()
        assert "config" in exc.value.message_dict


@pytest.mark.django_db
def test_save_refuses_a_name_if_any_address_is_internal(webhook, dns):
    dns["mixed.example.net"] = ["93.184.215.14", "10.1.2.3"]
    target = Target(
        webhook=webhook,
        name="t",
        type="slack",
        config={"webhook_url": "https://mixed.example.net/x"},
    )
    with pytest.raises(ValidationError, match=r"10\.1\.2\.3 is a private address"):
        target.full_clean()


@pytest.mark.django_db
def test_save_refuses_a_name_that_does_not_resolve(webhook):
    target = Target(webhook=webhook, name="t", type="http", config={"url": "http://nowhere.test/x"})
    with pytest.raises(ValidationError, match="does not resolve"):
        target.full_clean()


@pytest.mark.django_db
def test_allowlist_opens_exactly_the_listed_networks(webhook, settings, dns):
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = ["10.1.0.0/16", "fd00:1::/64"]
    assert ssrf.refusal("10.1.200.3") is None
    assert ssrf.refusal("::ffff:10.1.0.9") is None
    assert ssrf.refusal("fd00:1::5") is None
    assert ssrf.refusal("10.2.0.1")
    assert ssrf.refusal("fd00:2::5")
    assert ssrf.refusal("127.0.0.1")
    assert ssrf.refusal("169.254.169.254")
    dns["ok.example.net"] = ["10.1.0.7"]
    Target(
        webhook=webhook, name="t", type="http", config={"url": "http://ok.example.net/x"}
    ).full_clean()


@pytest.mark.django_db
def test_dns_rebinding_is_blocked_at_connect_time(entrypoint, make_target, sink, dns, settings):
    """Public when saved, 127.0.0.1 when delivered: the transport refuses it."""
    dns["rebind.example.net"] = ["93.184.215.14"]
    target = Target(
        webhook=entrypoint.webhook,
        name="rebind",
        type="http",
        config={"url": f"http://rebind.example.net:{sink.port}/x"},
        max_retries=5,
    )
    target.full_clean()
    target.save()
    dns["rebind.example.net"] = ["127.0.0.1"]  # the attacker's DNS changes its answer
    attempt_one(entrypoint)
    delivery = Delivery.objects.get()
    assert delivery.status == "failed"  # permanent: no retries spent on it
    result = DeliveryResult.objects.get()
    assert "blocked" in result.error and "127.0.0.1 is a loopback address" in result.error
    assert sink.requests() == []


@pytest.mark.django_db
def test_the_same_url_is_delivered_when_its_network_is_allowed(entrypoint, sink, dns, settings):
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = ["127.0.0.0/8"]
    dns["local.example.net"] = ["127.0.0.1"]
    Target.objects.create(
        webhook=entrypoint.webhook,
        name="ok",
        type="http",
        config={"url": f"http://local.example.net:{sink.port}/x"},
    )
    attempt_one(entrypoint)
    assert Delivery.objects.get().status == "delivered"
    assert sink.requests("/x")[0].headers["Host"] == f"local.example.net:{sink.port}"


@pytest.mark.django_db
def test_admin_form_shows_a_blocked_url_as_a_field_error(admin_client):
    from tests.support.admin import inline_data

    response = admin_client.post(
        "/admin/deliveries/webhook/add/", inline_data(url="http://169.254.169.254/latest/meta-data")
    )
    assert response.status_code == 200
    formset = next(
        f for f in response.context["inline_admin_formsets"] if f.formset.prefix == "targets"
    ).formset
    assert "link-local" in str(formset.forms[0].errors["url"])


def test_deprecated_site_local_ipv6_is_blocked():
    assert ssrf.refusal("fec0::1")
