"""API keys in the admin and on the command line, and the commands people script:
createapikey, redeliver, replay."""

import datetime
import io
import re

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from deliveries import replays
from deliveries.models import ApiKey, Delivery, Event, ReplayJob, Target
from tests.support.admin import client_for
from tests.support.api import client_with, fresh_throttle, world_ids  # noqa: F401
from tests.support.engines import store

pytestmark = pytest.mark.django_db

KEY = re.compile(r"whk_[A-Za-z0-9_-]{43}")


def create_in_admin(client, **data):
    response = client.post(reverse("admin:deliveries_apikey_add"), data, follow=True)
    assert response.status_code == 200
    keys = KEY.findall(response.content.decode())
    assert len(keys) == 1, "the new key is shown once, in the message"
    return keys[0], response


def test_a_key_made_in_the_admin_is_shown_once_and_works(alice):
    admin = client_for(alice)
    key, _ = create_in_admin(admin, name="terraform")
    stored = ApiKey.objects.get()
    assert (stored.user, stored.name, stored.digest) == (alice, "terraform", ApiKey.digest_of(key))
    # Only the prefix is shown from then on.
    listing = admin.get(reverse("admin:deliveries_apikey_changelist")).content.decode()
    page = admin.get(reverse("admin:deliveries_apikey_change", args=[stored.pk])).content.decode()
    for html in (listing, page):
        assert stored.prefix in html and key not in html
    assert client_with(key).get("/api/v1/webhooks/").status_code == 200


def test_revoking_in_the_admin_stops_the_key(alice):
    admin = client_for(alice)
    key, _ = create_in_admin(admin, name="ci")
    response = admin.post(
        reverse("admin:deliveries_apikey_changelist"),
        {"action": "revoke", "_selected_action": [ApiKey.objects.get().pk]},
        follow=True,
    )
    assert "Revoked 1 keys." in response.content.decode()
    assert client_with(key).get("/api/v1/webhooks/").status_code == 401


def test_an_expiry_set_in_the_admin_ends_the_key(alice):
    admin = client_for(alice)
    soon = timezone.now() + datetime.timedelta(hours=1)
    key, _ = create_in_admin(
        admin, name="temp", expires_at_0=soon.date().isoformat(), expires_at_1="23:59:59"
    )
    assert ApiKey.objects.get().expires_at is not None
    assert client_with(key).get("/api/v1/webhooks/").status_code == 200
    ApiKey.objects.update(expires_at=timezone.now())
    assert client_with(key).get("/api/v1/webhooks/").status_code == 401


def test_users_see_only_their_own_keys(alice, bob, superuser):
    create_in_admin(client_for(alice), name="alices")
    theirs = ApiKey.objects.get()
    bobs_admin = client_for(bob)
    listing = bobs_admin.get(reverse("admin:deliveries_apikey_changelist")).content.decode()
    assert "alices" not in listing
    page = bobs_admin.get(reverse("admin:deliveries_apikey_change", args=[theirs.pk]))
    assert page.status_code == 404
    # A non-superuser cannot make a key for someone else.
    create_in_admin(bobs_admin, name="bobs", user=alice.pk)
    assert ApiKey.objects.get(name="bobs").user == bob
    listing = client_for(superuser).get(reverse("admin:deliveries_apikey_changelist"))
    assert "alices" in listing.content.decode() and "bobs" in listing.content.decode()


# --- commands ----------------------------------------------------------------------


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_createapikey_prints_the_key_on_its_last_line(user):
    printed = run("createapikey", user.username, "--name", "deploy")
    key = printed.splitlines()[-1]
    assert KEY.fullmatch(key)
    assert ApiKey.objects.get().name == "deploy"
    assert client_with(key).get("/api/v1/webhooks/").status_code == 200


def test_createapikey_refuses_unknown_users_and_bad_times(user):
    with pytest.raises(CommandError, match="No user"):
        run("createapikey", "nobody", "--name", "x")
    with pytest.raises(CommandError, match="--expires"):
        run("createapikey", user.username, "--name", "x", "--expires", "someday")
    assert not ApiKey.objects.exists()


def test_redeliver_failed_for_a_target_since_a_time(alice):
    ids = world_ids(alice, "hook")
    target = Target.objects.get(pk=ids["target"])
    Delivery.objects.filter(pk=ids["delivery"]).update(
        updated_at=timezone.now() - datetime.timedelta(days=3)
    )
    recent = store(target.webhook.entrypoints.get(), n=2)
    Delivery.objects.filter(event__in=recent).update(status="failed", attempts=1)
    since = (timezone.now() - datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    printed = run("redeliver", "--target", str(target.pk), "--status", "failed", "--since", since)
    assert printed.strip() == "Queued 2 deliveries for redelivery (2 matched)."
    assert Delivery.objects.get(pk=ids["delivery"]).status == "failed"
    assert set(Delivery.objects.filter(status="pending").values_list("event", flat=True)) == {
        e.pk for e in recent
    }


def test_redeliver_refuses_bad_options_and_no_selection():
    with pytest.raises(CommandError, match="--since"):
        run("redeliver", "--status", "failed", "--since", "last tuesday")
    with pytest.raises(CommandError, match="--status"):
        run("redeliver", "--status", "lost")
    with pytest.raises(CommandError, match="at least one"):
        run("redeliver")


def test_replay_a_webhook_since_a_time_onto_a_new_target(alice):
    ids = world_ids(alice, "hook")
    Event.objects.filter(pk=ids["event"]).update(
        received_at=timezone.now() - datetime.timedelta(days=3)
    )
    target = Target.objects.get(pk=ids["target"])
    recent = store(target.webhook.entrypoints.get(), n=2)
    late = Target.objects.create(webhook=target.webhook, name="late", type="log")
    since = (timezone.now() - datetime.timedelta(days=1)).isoformat()
    window = ("replay", "--webhook", str(target.webhook_id), "--since", since)
    assert run(*window, "--target", str(late.pk), "--dry-run").strip() == (
        "Would send 2 deliveries again."
    )
    assert not late.deliveries.exists()
    jobs = set(ReplayJob.objects.values_list("pk", flat=True))  # the world's paused one
    # A window is a replay job: the engines create and send the deliveries.
    printed = run(*window, "--target", str(late.pk))
    (job,) = ReplayJob.objects.exclude(pk__in=jobs)
    assert printed.strip() == (
        f"Replay job {job.pk} started (2 deliveries to send); the engines run it."
    )
    assert (job.webhook_id, job.to_target, job.target, job.statuses) == (
        target.webhook_id,
        late,
        None,
        [],
    )
    while replays.step({0}, 1):
        pass
    assert set(late.deliveries.values_list("event", flat=True)) == {e.pk for e in recent}
    # Events by id are queued at once; without --target, to every target, the
    # one added since included.
    assert run("replay", "--ids", str(ids["event"]), "--dry-run").strip() == (
        "Would send 1 events again."
    )
    printed = run("replay", "--ids", str(ids["event"]))
    assert printed.strip() == "Queued 2 deliveries: 1 redelivered, 1 new."


def test_replay_job_options_are_checked(alice):
    ids = world_ids(alice, "hook")
    jobs = ReplayJob.objects.count()
    window = ("replay", "--webhook", str(ids["webhook"]), "--since", "2026-01-01T00:00")
    with pytest.raises(CommandError, match="--until: Must be after since"):
        run(*window, "--until", "2025-01-01T00:00")
    with pytest.raises(CommandError, match="--status: Pending and retrying"):
        run(*window, "--status", "pending")
    with pytest.raises(CommandError, match="--from-target, --status: only for a replay job"):
        run(
            "replay",
            "--ids",
            str(ids["event"]),
            "--from-target",
            str(ids["target"]),
            "--status",
            "failed",
        )
    with pytest.raises(CommandError, match="No webhook 999999"):
        run("replay", "--webhook", "999999", "--since", "2026-01-01T00:00")
    assert ReplayJob.objects.count() == jobs


def test_replay_refuses_a_target_of_another_webhook(alice):
    ids = world_ids(alice, "hook")
    other = world_ids(alice, "other")
    with pytest.raises(CommandError, match="not a target of webhook"):
        run("replay", "--webhook", str(ids["webhook"]), "--target", str(other["target"]))
    with pytest.raises(CommandError, match="No target"):
        run("replay", "--webhook", str(ids["webhook"]), "--target", "999999")
