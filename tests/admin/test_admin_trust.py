"""The admin's side of trust: entrypoint verification and dedup settings, rejected
requests, signing secrets (masked, revealed, rotated), provider ids on events."""

import hashlib
import hmac

import pytest
from django.urls import reverse

from deliveries.models import Entrypoint, Event, Rejection, Target
from tests.support.admin import client_for, world

pytestmark = pytest.mark.django_db


def entrypoint_data(**fields):
    data = {
        "description": "github",
        "active": "on",
        "verification": "github",
        "secret": "",
        "header": "",
        "algorithm": "sha256",
        "encoding": "hex",
        "prefix": "",
        "username": "",
        "password": "",
        "dedup": "on",
        "dedup_source": "",
        "rejections-TOTAL_FORMS": "0",
        "rejections-INITIAL_FORMS": "0",
        "rejections-MIN_NUM_FORMS": "0",
        "rejections-MAX_NUM_FORMS": "1000",
    }
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def test_a_secret_is_entered_once_and_shown_masked_afterwards(alice):
    hook, *_ = world(alice, "gh")
    entrypoint = hook.entrypoints.get()
    client = client_for(alice)
    url = reverse("admin:deliveries_entrypoint_change", args=[entrypoint.pk])

    response = client.post(url, entrypoint_data(secret="It's a Secret to Everybody"))
    assert response.status_code == 302, response.content.decode()[:3000]
    entrypoint.refresh_from_db()
    assert entrypoint.verification == "github"
    assert entrypoint.verification_config == {"secret": "It's a Secret to Everybody"}
    assert entrypoint.dedup is True

    page = client.get(url).content.decode()
    assert "It's a Secret to Everybody" not in page
    assert "It&#x27;s a Secret to Everybody" not in page
    assert "body" in page  # the "ody" of the masked secret's last four
    # Saved again without typing it: the stored secret stays.
    assert client.post(url, entrypoint_data(description="renamed")).status_code == 302
    entrypoint.refresh_from_db()
    assert entrypoint.verification_config == {"secret": "It's a Secret to Everybody"}
    assert entrypoint.description == "renamed"


def test_a_new_preset_needs_its_own_secret(alice):
    hook, *_ = world(alice, "gh")
    entrypoint = hook.entrypoints.get()
    Entrypoint.objects.filter(pk=entrypoint.pk).update(
        verification="github", verification_config={"secret": "gh"}
    )
    url = reverse("admin:deliveries_entrypoint_change", args=[entrypoint.pk])
    response = client_for(alice).post(url, entrypoint_data(verification="stripe", dedup=None))
    assert response.status_code == 200
    assert "secret" in response.context["adminform"].form.errors


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"verification": "hmac", "secret": "s", "header": ""}, "header"),
        ({"verification": "hmac", "secret": "s", "header": "Bad Header"}, "header"),
        (
            {"verification": "hmac", "secret": "s", "header": "X-Sig", "algorithm": "md5"},
            "algorithm",
        ),
        ({"verification": "basic", "username": "a:b", "password": "p"}, "username"),
        ({"verification": "standard_webhooks", "secret": "whsec_!!"}, "secret"),
        ({"verification": "none", "dedup": "on"}, "dedup_source"),
        ({"verification": "none", "dedup_source": "query:id"}, "dedup_source"),
        ({"verification": "carrier-pigeon"}, "verification"),
    ],
)
def test_bad_settings_are_field_errors_never_a_traceback(alice, fields, field):
    hook, *_ = world(alice, "gh")
    entrypoint = hook.entrypoints.get()
    url = reverse("admin:deliveries_entrypoint_change", args=[entrypoint.pk])
    response = client_for(alice).post(url, entrypoint_data(**{"dedup": None, **fields}))
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    entrypoint.refresh_from_db()
    assert entrypoint.verification == "none"


def test_the_entrypoint_page_lists_rejections_and_the_webhook_links_to_it(alice, client):
    hook, *_ = world(alice, "gh")
    entrypoint = hook.entrypoints.get()
    Entrypoint.objects.filter(pk=entrypoint.pk).update(
        verification="github", verification_config={"secret": "s"}
    )
    client.post(
        f"/webhook/{entrypoint.code}",
        b"{}",
        content_type="application/json",
        headers={"X-Hub-Signature-256": "sha256=00"},
        REMOTE_ADDR="198.51.100.7",
    )
    assert Rejection.objects.count() == 1
    admin = client_for(alice)
    page = admin.get(reverse("admin:deliveries_entrypoint_change", args=[entrypoint.pk]))
    text = page.content.decode()
    assert "signature mismatch" in text and "198.51.100.7" in text
    webhook_page = admin.get(reverse("admin:deliveries_webhook_change", args=[hook.pk]))
    assert reverse("admin:deliveries_entrypoint_change", args=[entrypoint.pk]) in (
        webhook_page.content.decode()
    )


def test_another_users_entrypoint_is_404(alice, bob):
    hook, *_ = world(bob, "bobs")
    url = reverse("admin:deliveries_entrypoint_change", args=[hook.entrypoints.get().pk])
    assert client_for(alice).get(url).status_code == 404
    assert client_for(alice).post(url, entrypoint_data(secret="x")).status_code == 404


def test_the_target_page_masks_the_secret_and_rotates_it(alice, settings):
    settings.SIGNING_ROTATION_OVERLAP = 7200
    _, target, *_ = world(alice, "signed")
    old = target.signing_secret
    client = client_for(alice)
    page = client.get(reverse("admin:deliveries_target_change", args=[target.pk])).content
    text = page.decode()
    assert "Rotate secret" in text and "Reveal" in text
    # The secret is in the page only for Reveal and Copy, never as the visible text.
    assert f">{old}</code>" not in text
    assert f">whsec_••••••••{old[-4:]}</code>" in text

    rotate = reverse("admin:deliveries_target_rotate_secret", args=[target.pk])
    assert client.get(rotate).status_code == 405
    response = client.post(rotate)
    assert response.status_code == 302
    target.refresh_from_db()
    assert target.signing_secret != old
    assert target.previous_signing_secret == old
    assert target.secret_rotated_at is not None
    [message] = client.get(response.url).context["messages"]
    assert "for 2 hours" in str(message)


def test_rotating_another_users_target_is_404(alice, bob):
    _, target, *_ = world(bob, "bobs")
    before = target.signing_secret
    rotate = reverse("admin:deliveries_target_rotate_secret", args=[target.pk])
    assert client_for(alice).post(rotate).status_code == 404
    target.refresh_from_db()
    assert target.signing_secret == before


def test_rotate_action_gives_each_selected_target_its_own_new_secret(alice):
    hook, first, *_ = world(alice, "a")
    second = Target.objects.create(
        webhook=hook, name="b", type="http", config={"url": "https://example.com/b"}
    )
    before = {first.pk: first.signing_secret, second.pk: second.signing_secret}
    client_for(alice).post(
        reverse("admin:deliveries_target_changelist"),
        {"action": "rotate_secrets", "_selected_action": [first.pk, second.pk]},
    )
    after = dict(Target.objects.values_list("pk", "signing_secret"))
    assert after[first.pk] != before[first.pk] and after[second.pk] != before[second.pk]
    assert after[first.pk] != after[second.pk]


def test_the_signing_switch_is_on_the_target_page(alice):
    _, target, *_ = world(alice, "switch")
    client = client_for(alice)
    url = reverse("admin:deliveries_target_change", args=[target.pk])
    form = client.get(url).context["adminform"].form
    assert form.initial["signing"] is True
    data = {k: v for k, v in form.initial.items() if v is not None and k != "signing"}
    data.update(
        {
            "name": target.name,
            "type": "http",
            "url": "https://example.com/x",
            "max_retries": 0,
            "max_queue_size": 10,
            "rate_limit": 0,
            "filters": "[]",
            "headers": "",
        }
    )
    data.pop("config", None)
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    target.refresh_from_db()
    assert target.signing is False


def test_events_are_found_by_provider_id_and_show_their_receipts(alice, client):
    hook, *_ = world(alice, "dedup")
    entrypoint = hook.entrypoints.get()
    Entrypoint.objects.filter(pk=entrypoint.pk).update(
        verification="github", verification_config={"secret": "s"}, dedup=True
    )
    body = b'{"action": "opened"}'
    signature = "sha256=" + hmac.new(b"s", body, hashlib.sha256).hexdigest()
    headers = {"X-Hub-Signature-256": signature, "X-GitHub-Delivery": "gh-delivery-42"}
    for _ in range(3):
        client.post(
            f"/webhook/{entrypoint.code}", body, content_type="application/json", headers=headers
        )
    event = Event.objects.get(provider_id="gh-delivery-42")
    admin = client_for(alice)
    found = admin.get(reverse("admin:deliveries_event_changelist"), {"q": "gh-delivery-42"})
    assert list(found.context["cl"].result_list) == [event]
    assert (
        not admin.get(reverse("admin:deliveries_event_changelist"), {"q": "gh-delivery-4"})
        .context["cl"]
        .result_list
    )
    page = admin.get(reverse("admin:deliveries_event_change", args=[event.pk])).content.decode()
    assert "3 times" in page


def test_the_entrypoint_list_shows_only_ones_own(alice, bob):
    mine, *_ = world(alice, "mine")
    world(bob, "theirs")
    response = client_for(alice).get(reverse("admin:deliveries_entrypoint_changelist"))
    assert response.status_code == 200
    assert [e.webhook for e in response.context["cl"].result_list] == [mine]
