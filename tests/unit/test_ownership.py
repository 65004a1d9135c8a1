"""The ownership boundary: visible_to() per model, and every consumer going through it."""

from unittest import mock

import pytest
from django.contrib.auth.models import AnonymousUser
from django.urls import reverse

from deliveries import wake
from deliveries.models import (
    Delivery,
    Entrypoint,
    Event,
    OwnedQuerySet,
    Target,
    Webhook,
)
from tests.support.admin import client_for, world

pytestmark = pytest.mark.django_db

MODELS = [Webhook, Entrypoint, Target, Event, Delivery]


@pytest.fixture
def worlds(alice, bob):
    """Each user's rows, by model: {user: {model: pk}}."""
    rows = {}
    for user in (alice, bob):
        hook, target, event, delivery = world(user, f"{user.username}-hook")
        rows[user] = {
            Webhook: hook.pk,
            Entrypoint: hook.entrypoints.get().pk,
            Target: target.pk,
            Event: event.pk,
            Delivery: delivery.pk,
        }
    return rows


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_owners_see_their_own_rows_and_a_superuser_sees_all(model, worlds, alice, bob, superuser):
    def visible(user):
        return set(model.objects.visible_to(user).values_list("pk", flat=True))

    assert visible(alice) == {worlds[alice][model]}
    assert visible(bob) == {worlds[bob][model]}
    assert visible(superuser) == {worlds[alice][model], worlds[bob][model]}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_anonymous_and_inactive_users_see_nothing(model, worlds, alice, superuser):
    superuser.is_active = False
    alice.is_active = False
    for user in (AnonymousUser(), alice, superuser):
        assert not model.objects.visible_to(user).exists()


class Spy:
    """Wraps the one ownership rule: records each call as (model, username)."""

    def __init__(self, patched):
        self.patched = patched

    def seen(self):
        return {(c.args[0].model, c.args[1].username) for c in self.patched.call_args_list}

    def reset(self):
        self.patched.reset_mock()


@pytest.fixture
def spy():
    with mock.patch.object(
        OwnedQuerySet, "visible_to", autospec=True, side_effect=OwnedQuerySet.visible_to
    ) as patched:
        yield Spy(patched)


def test_admin_lists_go_through_visible_to(alice, worlds, spy):
    client = client_for(alice)
    for model in (Webhook, Event, Delivery):
        spy.reset()
        url = reverse(f"admin:deliveries_{model._meta.model_name}_changelist")
        body = client.get(url).content.decode()
        assert "alice-hook" in body and "bob-hook" not in body
        assert (model, "alice") in spy.seen()


def test_admin_filter_choices_go_through_visible_to(alice, worlds, spy):
    response = client_for(alice).get(reverse("admin:deliveries_delivery_changelist"))
    choices = {
        spec.title: [label for _, label in spec.lookup_choices]
        for spec in response.context["cl"].filter_specs
        if hasattr(spec, "lookup_choices")
    }
    assert choices["webhook"] == ["alice-hook"]
    assert choices["target"] == ["alice-hook → alice-hook-target"]
    assert {(Webhook, "alice"), (Target, "alice")} <= spy.seen()


def test_dashboard_goes_through_visible_to(alice, worlds, spy):
    body = client_for(alice).get(reverse("admin:index")).content.decode()
    assert 'id="wh-count-failed">1<' in body  # bob's failed delivery is not counted
    assert (Delivery, "alice") in spy.seen()


@pytest.mark.parametrize(
    ("model", "action"), [(Delivery, "redeliver"), (Event, "replay")], ids=["redeliver", "replay"]
)
def test_actions_go_through_visible_to(model, action, alice, bob, worlds, spy):
    theirs = worlds[bob][model]
    response = client_for(alice).post(
        reverse(f"admin:deliveries_{model._meta.model_name}_changelist"),
        {"action": action, "_selected_action": [theirs]},
    )
    assert response.status_code == 302
    assert (model, "alice") in spy.seen()
    assert Delivery.objects.get(pk=worlds[bob][Delivery]).status == "failed"


@pytest.fixture
def notify():
    with mock.patch.object(wake, "notify_on_commit") as patched:
        yield patched


def test_redeliver_sets_finished_deliveries_back_and_wakes_the_engine(alice, worlds, notify):
    *_, failed = world(alice, "more")
    retrying = worlds[alice][Delivery]
    Delivery.objects.filter(pk=retrying).update(status="retrying")
    notify.reset_mock()  # storing the event woke it too
    assert Delivery.objects.filter(pk__in=[retrying, failed.pk]).redeliver() == 1
    assert Delivery.objects.get(pk=retrying).status == "retrying"
    delivery = Delivery.objects.get(pk=failed.pk)
    assert (delivery.status, delivery.attempts, delivery.results.count()) == ("pending", 1, 1)
    assert notify.call_count == 1
    assert Delivery.objects.filter(pk=retrying).redeliver() == 0
    assert notify.call_count == 1  # nothing to do, nobody woken


def test_replay_sets_back_and_adds_deliveries_for_new_targets(alice, worlds, notify):
    event = Event.objects.get(pk=worlds[alice][Event])
    new = Target.objects.create(webhook=event.webhook, name="new", type="log")
    Target.objects.create(webhook=event.webhook, name="off", type="log", active=False)
    assert Event.objects.filter(pk=event.pk).replay() == (1, 1)
    assert Delivery.objects.get(pk=worlds[alice][Delivery]).status == "pending"
    assert Delivery.objects.get(event=event, target=new).status == "pending"
    assert notify.call_count == 1
    assert Event.objects.filter(pk=event.pk).replay() == (0, 0)  # nothing finished, none new
    assert notify.call_count == 1


def test_a_changed_target_wakes_the_engine_whichever_way_it_is_saved(alice, worlds, notify):
    """The rule's one home is Target.save(): the admin's form, the API and code all
    go through it. A new target has nothing waiting and wakes nobody."""
    webhook = Event.objects.get(pk=worlds[alice][Event]).webhook
    notify.reset_mock()
    target = Target.objects.create(webhook=webhook, name="new", type="log")
    assert notify.call_count == 0
    target.active = False
    target.save()
    assert notify.call_count == 1
    target.rotate_signing_secret()
    assert notify.call_count == 2
