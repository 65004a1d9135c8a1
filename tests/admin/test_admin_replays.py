"""Replay jobs in the console: the form prefilled from the lists' filters, its dry-run
count, the job's page (progress, reloading while it runs), pause, resume, cancel, and
ownership."""

import datetime
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from deliveries import replays
from deliveries.models import Delivery, ReplayJob, Target
from tests.support.admin import client_for, world
from tests.support.history import OUTAGE_END, OUTAGE_START, outage

pytestmark = pytest.mark.django_db

ADD = reverse("admin:deliveries_replayjob_add")
JOBS = reverse("admin:deliveries_replayjob_changelist")
LOCAL = "%Y-%m-%dT%H:%M"


def page(job):
    return reverse("admin:deliveries_replayjob_change", args=[job.pk])


def control(job, verb):
    return reverse(f"admin:deliveries_replayjob_{verb}", args=[job.pk])


def form_data(hook, **fields):
    return {
        "webhook": str(hook.pk),
        "since": OUTAGE_START.strftime(LOCAL),
        "until": OUTAGE_END.strftime(LOCAL),
        **fields,
    }


def test_count_then_start_then_follow_a_job(alice):
    hook, target, _, _ = world(alice, "alices")
    outage(hook, [target], n=120, outside=10)
    client = client_for(alice)

    form = client.get(ADD)
    assert form.status_code == 200
    assert form.context["submit"] == "Count (dry run)"
    counted = client.post(ADD, form_data(hook, statuses=["failed"]))
    # The dry run: the exact number, and nothing started yet.
    assert counted.context["count"] == 120
    assert "Start the replay: 120 deliveries" in counted.content.decode()
    assert not ReplayJob.objects.filter(webhook=hook).exists()
    hidden = counted.context["hidden"]
    posted_until = OUTAGE_END.replace(second=0).isoformat()  # the form posts minutes
    assert (hidden["until"], hidden["statuses"]) == (posted_until, ["failed"])

    started = client.post(ADD, hidden, follow=True)
    job = ReplayJob.objects.get(webhook=hook)
    assert started.redirect_chain[-1][0] == page(job)
    assert (job.state, job.statuses, job.created_by, job.to_target) == (
        "planning",
        ["failed"],
        alice,
        None,
    )
    body = started.content.decode()
    assert "planning…" in body and '<meta http-equiv="refresh"' in body

    replays.step({0}, 1, window=50)
    body = client.get(page(job)).content.decode()
    assert "matched 120 · queued 50 · delivered 0 · failed 0" in body
    assert re.search(r"<progress max=\"120\" value=\"0\">", body)
    while Delivery.objects.filter(status="pending").update(status="delivered"):
        replays.step({0}, 1, window=50)  # as the engine would: settle, queue more
    replays.step({0}, 1, window=50)
    job.refresh_from_db()
    assert (job.state, job.queued, job.delivered) == ("done", 120, 120)
    body = client.get(page(job)).content.decode()
    assert "matched 120 · queued 120 · delivered 120 · failed 0" in body
    assert '<meta http-equiv="refresh"' not in body  # over: it stops reloading
    listed = client.get(JOBS).content.decode()
    assert f"Replay {job.pk}" in listed and "failed → same targets" in listed


def test_the_form_says_what_is_wrong_by_field(alice):
    hook, _target, _, _ = world(alice, "alices")
    client = client_for(alice)
    response = client.post(ADD, form_data(hook, until=OUTAGE_START.strftime(LOCAL)))
    assert response.context["form"].errors == {"until": ["Must be after since."]}
    response = client.post(ADD, form_data(hook, statuses=["pending"]))
    assert "Pending and retrying" in response.context["form"].errors["statuses"][0]
    response = client.post(ADD, form_data(hook, statuses=["lost"]))
    assert "statuses" in response.context["form"].errors
    # Nothing in the window: said, and nothing started.
    response = client.post(ADD, form_data(hook), follow=True)
    assert "Nothing matches: no job started." in response.content.decode()
    assert not ReplayJob.objects.exists()


def test_to_a_new_target_and_only_one_targets_deliveries(alice):
    hook, target, _, _ = world(alice, "alices")
    other = Target.objects.create(webhook=hook, name="other", type="log")
    new = Target.objects.create(webhook=hook, name="new", type="log")
    outage(hook, [target, other], n=30, outside=5)
    client = client_for(alice)
    asked = form_data(hook, target=str(other.pk), to_target=str(new.pk))
    counted = client.post(ADD, asked)
    assert counted.context["count"] == 30
    assert "sent to new" in counted.context["intro"]
    client.post(ADD, counted.context["hidden"])
    job = ReplayJob.objects.get()
    assert (job.target, job.to_target) == (other, new)
    while replays.step({0}, 1):
        pass
    assert new.deliveries.count() == 30


def test_pause_resume_and_cancel_from_the_jobs_page(alice):
    hook, target, _, _ = world(alice, "alices")
    outage(hook, [target], n=60, outside=0)
    job = replays.start(replays.Criteria(hook, OUTAGE_START, OUTAGE_END), alice)
    replays.step({0}, 1, window=20)
    client = client_for(alice)
    buttons = re.findall(r'formaction="([^"?]+)', client.get(page(job)).content.decode())
    assert buttons == [control(job, "pause"), control(job, "cancel")]

    after = client.post(control(job, "pause") + f"?next={page(job)}", follow=True)
    assert after.redirect_chain[-1][0] == page(job)
    assert f"Replay job {job.pk}: pause done." in after.content.decode()
    job.refresh_from_db()
    assert job.state == "paused"
    buttons = re.findall(r'formaction="([^"?]+)', after.content.decode())
    assert buttons == [control(job, "resume"), control(job, "cancel")]

    client.post(control(job, "resume"))
    job.refresh_from_db()
    assert job.state == "running"
    client.post(control(job, "cancel"))
    job.refresh_from_db()
    assert job.state == "cancelled"
    again = client.post(control(job, "resume"), follow=True)
    assert f"Replay job {job.pk} is cancelled: nothing to resume." in again.content.decode()
    assert client.get(control(job, "cancel")).status_code == 405


def test_the_lists_link_to_a_job_prefilled_from_their_filters(alice):
    hook, target, _, _ = world(alice, "alices")
    client = client_for(alice)
    events = client.get(
        reverse("admin:deliveries_event_changelist"),
        {
            "webhook": hook.pk,
            "delivery_status": "failed",
            "received_at_from_0": "2026-11-30",
            "received_at_from_1": "06:00",
            "received_at_to_0": "2026-11-30",
            "received_at_to_1": "12:00",
        },
    )
    link = events.context["replay_url"]
    assert link.startswith(ADD) and "wh-replay-link" in events.content.decode()
    form = client.get(link).context["form"]
    assert form.initial == {
        "webhook": str(hook.pk),
        "since": "2026-11-30T06:00",
        "until": "2026-11-30T12:00",
        "statuses": ["failed"],
    }
    deliveries = client.get(
        reverse("admin:deliveries_delivery_changelist"),
        {"target": target.pk, "status__exact": "failed"},
    )
    form = client.get(deliveries.context["replay_url"]).context["form"]
    # The target's webhook, filled in from the target.
    assert form.initial == {"webhook": hook.pk, "target": str(target.pk), "statuses": ["failed"]}
    rendered = client.get(deliveries.context["replay_url"]).content.decode()
    assert f'<option value="{target.pk}" selected>' in rendered


def test_another_users_jobs_webhooks_and_targets_are_not_there(alice, bob):
    hook, _target, _, _ = world(alice, "alices")
    theirs, their_target, _, _ = world(bob, "bobs-secret")
    job = replays.start(replays.Criteria(theirs, OUTAGE_START, OUTAGE_END), bob)
    client = client_for(alice)
    assert client.get(page(job)).status_code == 404
    assert client.post(control(job, "cancel")).status_code == 404
    assert "bobs-secret" not in client.get(JOBS).content.decode()
    assert "bobs-secret" not in client.get(ADD).content.decode()
    response = client.post(ADD, form_data(theirs))
    assert "webhook" in response.context["form"].errors
    response = client.post(ADD, form_data(hook, to_target=str(their_target.pk)))
    assert "to_target" in response.context["form"].errors
    job.refresh_from_db()
    assert job.state == "planning"


def test_a_user_without_the_permission_gets_no_link_and_no_form(alice):
    alice.groups.clear()
    alice.user_permissions.add(
        *type(alice).user_permissions.field.related_model.objects.filter(
            codename__in=["view_event", "view_delivery"]
        )
    )
    client = client_for(alice)
    events = client.get(reverse("admin:deliveries_event_changelist"))
    assert events.context["replay_url"] == ""
    assert client.get(ADD).status_code == 403


def test_the_job_started_is_the_window_counted_to_the_microsecond(alice):
    """`until` left empty is now when counted; the job must end there, not at the
    minute (which dropped the events of the last seconds, an outage's tail)."""
    hook, _target, event, _ = world(alice, "alices")
    since = timezone.now().replace(second=0, microsecond=0) - datetime.timedelta(hours=2)
    client = client_for(alice)
    response = client.post(ADD, {"webhook": hook.pk, "since": since.strftime(LOCAL)})
    assert response.context["count"] == 1  # the world's event, a moment ago
    counted = datetime.datetime.fromisoformat(response.context["hidden"]["until"])
    assert counted > event.received_at
    client.post(ADD, response.context["hidden"])
    job = ReplayJob.objects.get(webhook=hook)
    assert (job.since, job.until) == (since, counted)
    assert replays.Criteria.of(job).count() == 1
