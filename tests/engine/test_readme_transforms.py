"""The README's five transform examples, read from the README itself, each run by
the engine on a stored event and sent to a real receiver."""

import json
import re
from pathlib import Path

import pytest

from deliveries.models import Delivery
from tests.support.engines import pump, started_engine, store

pytestmark = pytest.mark.django_db

README = Path(__file__).resolve().parents[2] / "README.md"


def examples() -> dict[str, str]:
    """{title: program} of the README's Transformations section."""
    text = README.read_text()
    section = text[text.index("## Transformations") :]
    section = section[: section.index("\n## ", 1)]
    found = re.findall(r"\*\*([^*\n]+)\*\*(?:(?!```).)*?```jq\n(.*?)```", section, re.S)
    return {title.rstrip(":"): program.strip() for title, program in found}


PUSH = {
    "ref": "refs/heads/main",
    "commits": [{"id": "a"}, {"id": "b"}],
    "repository": {"full_name": "acme/api"},
    "pusher": {"name": "ann"},
}
CHARGE = {
    "id": "evt_1",
    "type": "charge.succeeded",
    "livemode": True,
    "data": {"object": {"id": "ch_1", "amount": 1200, "currency": "eur"}},
}


def run(entrypoint, make_target, sink, program, body, headers=(), type_="http"):
    """Deliver one event through a target with `program`; the request received, or
    None with the delivery dropped."""
    if type_ == "slack":
        target = make_target(type_, config={"webhook_url": sink.url("/in")}, transform=program)
    else:
        target = make_target(url=sink.url("/in"), transform=program)
    engine = started_engine()
    store(
        entrypoint,
        body=json.dumps(body).encode(),
        headers=[["Content-Type", "application/json"], *headers],
    )
    pump(engine, lambda: Delivery.objects.filter(target=target, status__in=Delivery.FINISHED))
    delivery = Delivery.objects.get(target=target)
    if delivery.status == "filtered":
        assert delivery.reason == "dropped by transform"
        return None
    assert delivery.status == "delivered"
    return sink.wait_for(1)[-1]


def test_the_readme_has_the_five_examples():
    assert list(examples()) == [
        "GitHub push → Slack message",
        "A Stripe event → the three fields a service needs",
        "Add a header",
        "Drop test events",
        "Rename a field",
    ]


def test_github_push_to_slack(entrypoint, make_target, sink):
    program = examples()["GitHub push → Slack message"]
    received = run(
        entrypoint, make_target, sink, program, PUSH, [["X-GitHub-Event", "push"]], "slack"
    )
    assert json.loads(received.body) == {"text": "ann pushed 2 commit(s) to acme/api main"}


def test_other_github_events_are_not_sent_to_slack(entrypoint, make_target, sink):
    program = examples()["GitHub push → Slack message"]
    headers = [["X-GitHub-Event", "issues"]]
    assert run(entrypoint, make_target, sink, program, PUSH, headers, "slack") is None
    assert sink.requests() == []


def test_stripe_event_to_three_fields(entrypoint, make_target, sink):
    program = examples()["A Stripe event → the three fields a service needs"]
    received = run(entrypoint, make_target, sink, program, CHARGE)
    assert json.loads(received.body) == {"id": "evt_1", "type": "charge.succeeded", "amount": 1200}


def test_add_a_header(entrypoint, make_target, sink):
    program = examples()["Add a header"]
    received = run(entrypoint, make_target, sink, program, CHARGE, [["X-Debug", "1"]])
    assert received.headers["X-Tenant"] == "acme"
    assert "X-Debug" not in received.headers
    assert json.loads(received.body) == CHARGE  # the body as received


@pytest.mark.parametrize("live", [True, False])
def test_drop_test_events(entrypoint, make_target, sink, live):
    program = examples()["Drop test events"]
    received = run(entrypoint, make_target, sink, program, {**CHARGE, "livemode": live})
    if live:
        assert json.loads(received.body) == {**CHARGE, "livemode": True}
    else:
        assert received is None and sink.requests() == []


def test_rename_a_field(entrypoint, make_target, sink):
    program = examples()["Rename a field"]
    received = run(entrypoint, make_target, sink, program, {"customer": "cus_1", "total": 5})
    assert json.loads(received.body) == {"total": 5, "customer_id": "cus_1"}
