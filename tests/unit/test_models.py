"""Target config validation: field errors, never tracebacks."""

import datetime

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from deliveries.models import EngineStatus, Target

pytestmark = pytest.mark.django_db


def clean(webhook, type_, config):
    target = Target(webhook=webhook, name="t", type=type_, config=config)
    target.full_clean()
    return target


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"url": ""},
        {"url": "example.com/hook"},
        {"url": "/relative"},
        {"url": "ftp://example.com/x"},
        {"url": "javascript:alert(1)"},
        {"url": 42},
        {"url": "http://example.com", "headers": ["X-A: b"]},
        {"url": "http://example.com", "headers": {"Bad Name": "v"}},
        {"url": "http://example.com", "headers": {"X-A": "line\r\nbreak"}},
        {"url": "http://example.com", "headers": {"Host": "evil"}},
        {"url": "http://example.com", "timeout": 0},
        {"url": "http://example.com", "timeout": "ten"},
        {"url": "http://example.com", "timeout": 10_000},
        {"url": "http://example.com", "surprise": 1},
        ["not", "an", "object"],
        "a string",
    ],
)
def test_bad_http_configs_are_field_errors(webhook, config):
    with pytest.raises(ValidationError) as exc:
        clean(webhook, Target.Type.HTTP, config)
    assert "config" in exc.value.message_dict


def test_good_http_config_is_normalised(webhook):
    target = clean(
        webhook,
        Target.Type.HTTP,
        {"url": " https://example.com/hook ", "headers": {"X-Token": "t"}, "timeout": 5},
    )
    assert target.config == {
        "url": "https://example.com/hook",
        "headers": {"X-Token": "t"},
        "timeout": 5,
    }


@pytest.mark.parametrize("config", [{}, {"webhook_url": "not a url"}, {"url": "https://x.y"}])
def test_slack_needs_a_webhook_url(webhook, config):
    with pytest.raises(ValidationError) as exc:
        clean(webhook, Target.Type.SLACK, config)
    assert "config" in exc.value.message_dict


def test_slack_with_webhook_url_is_valid(webhook):
    target = clean(webhook, Target.Type.SLACK, {"webhook_url": "https://hooks.slack.com/x"})
    assert target.config == {"webhook_url": "https://hooks.slack.com/x"}


@pytest.mark.parametrize("type_", [Target.Type.DATABASE, Target.Type.LOG])
def test_database_and_log_need_no_config(webhook, type_):
    assert clean(webhook, type_, {}).config == {}


def test_new_webhook_gets_exactly_one_entrypoint(webhook):
    assert webhook.entrypoints.count() == 1
    webhook.ensure_entrypoint()
    assert webhook.entrypoints.count() == 1


def test_engine_liveness_follows_the_heartbeat():
    assert EngineStatus.objects.current().pk is None  # never started: a blank row
    now = timezone.now()
    assert not EngineStatus.objects.current().alive(now)
    EngineStatus.objects.create(started_at=now, heartbeat_at=now)
    engine = EngineStatus.objects.current()
    assert engine.alive(now) and engine.heartbeat_age(now) == 0
    late = now + datetime.timedelta(seconds=EngineStatus.STALE_AFTER)
    assert engine.alive(late)
    assert not engine.alive(late + datetime.timedelta(seconds=1))
    engine.stopped_at = now
    assert not engine.alive(now)
