"""A real browser walks the console's whole journey, on a desktop and on a phone.

Create a webhook with two targets (styled inputs, the type readable, each target
compact), land on its page with the inbound URL and a curl on top, send events,
find one by its provider id and one by payload text, open a failed delivery,
Retry now, watch its page reload itself until the attempt is in, and see it
delivered on the dashboard, which refreshes itself. Screenshots of every step go
to tests/artifacts/<width>-<step>.png; at 390 px no page scrolls sideways.

Chromium comes from Debian's package (.ci/run installs it), driven by Playwright's
Python package; Playwright's own browser download is never used.
"""

import os
import shutil
from pathlib import Path

import pytest
import requests
from django.conf import global_settings
from django.contrib.auth.models import User
from django.db import connections

from deliveries.models import Delivery, Entrypoint, Event, Webhook
from tests.support.processes import start_engine, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORTS = {"desktop": (1440, 900), "phone": (390, 844)}
PASSWORD = "browser-pw-123!"


# Whether the select's chosen option fits in it, uncut ("HTTP en…" did not).
TYPE_READS_WHOLE = """(selector) => {
  const select = document.querySelector(selector);
  const style = getComputedStyle(select);
  const context = document.createElement("canvas").getContext("2d");
  context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const text = select.options[select.selectedIndex].text;
  const room = select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return context.measureText(text).width <= room;
}"""
HAS_BORDER = (
    "(selector) => getComputedStyle(document.querySelector(selector)).borderTopWidth !== '0px'"
)


@pytest.fixture
def browser(monkeypatch):
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    # Playwright's sync API keeps an event loop on this thread; the test's own
    # ORM calls are still plain synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()
            # While Playwright's loop runs on this thread, asgiref keeps Django's
            # connections apart from the thread's own: the test's queries opened one
            # of their own, which the database teardown never saw. Left open, it kept
            # PostgreSQL from dropping the test database at the end of the run.
            connections.close_all()


class Journey:
    """The page, plus a screenshot and a no-sideways-scroll check at every step."""

    def __init__(self, page, base, width):
        self.page, self.base, self.width = page, base, width

    def go(self, path):
        self.page.goto(self.base + path)

    def log_in(self):
        """As the admin the test made, onto the dashboard."""
        self.go("/admin/login/")
        self.page.fill("#id_username", "admin")
        self.page.fill("#id_password", PASSWORD)
        self.page.click("[type=submit]")
        self.page.wait_for_selector("#wh-dashboard")

    def step(self, name):
        self.page.screenshot(path=str(ARTIFACTS / f"{self.width}-{name}.png"), full_page=True)
        if self.width < 500:
            scroll = self.page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= self.width, f"{name}: the page is {scroll} px wide"


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_the_console_journey(viewport, browser, sink, data_dir, settings):
    width, height = VIEWPORTS[viewport]
    # The gunicorn process checks the password with the real hashers.
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    User.objects.create_superuser("admin", password=PASSWORD)
    # A failed attempt waits a minute for its retry: long enough that only the
    # Retry now button can bring it forward within the test. The live pages
    # refresh every second, not every five: the journey watches them do it.
    env = {
        "DELIVERY_POLL_INTERVAL": "0.2",
        "DELIVERY_BACKOFF_BASE": "60",
        "WEBHOOKER_CONSOLE_REFRESH": "1",
    }
    web, base = start_web(data_dir, workers=1, **env)
    engine = start_engine(data_dir, **env)
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(20_000)
    journey = Journey(page, base, width)
    sink.respond("/flaky", 503)  # the second target fails once, then answers 200
    try:
        journey.log_in()
        journey.step("1-dashboard")

        # A webhook with two targets, through the form.
        journey.go("/admin/deliveries/webhook/add/")
        page.fill("#id_name", "From the browser")
        for n, (name, path) in enumerate([("steady", "/steady"), ("flaky", "/flaky")]):
            page.click("#targets-group a.add-row")
            page.fill(f"#id_targets-{n}-name", name)
            page.select_option(f"#id_targets-{n}-type", "http")
            page.fill(f"#id_targets-{n}-url", sink.url(path))
            # Retries by default, in the folded Delivery section.
            assert page.input_value(f"#id_targets-{n}-max_retries") == "5"
            target = page.locator(".form-group", has=page.locator(f"#id_targets-{n}-name"))
            assert page.evaluate(TYPE_READS_WHOLE, f"#id_targets-{n}-type")
            for field in ("url", "headers", "timeout"):
                assert page.evaluate(HAS_BORDER, f"#id_targets-{n}-{field}"), field
            if width > 1000:  # a target no longer takes a screen and a half
                assert target.bounding_box()["height"] < 700
        journey.step("2-webhook-form")
        page.click("[name=_save]")  # a new webhook's page follows, whichever button
        page.wait_for_selector("#wh-inbound .wh-url")
        inbound = page.inner_text(".wh-url")
        hook = Webhook.objects.get(name="From the browser")
        assert inbound == f"{base}/webhook/{hook.entrypoints.get().code}"
        assert f"curl -X POST {inbound} -H" in page.inner_text("#wh-inbound")
        journey.step("3-webhook")

        # Events: the sender's id read from X-GitHub-Delivery.
        Entrypoint.objects.filter(webhook=hook).update(dedup_source="header:X-GitHub-Delivery")
        sent = {}
        for n, customer in enumerate(["cus_alpha", "cus_needle", "cus_omega"]):
            response = requests.post(
                inbound,
                json={"customer": customer},
                headers={"X-GitHub-Event": "push", "X-GitHub-Delivery": f"gh-{n}"},
                timeout=10,
            )
            assert response.status_code == 200
            sent[customer] = response.json()["event"]
        sink.wait_for(3, "/steady", timeout=20)
        wait_until(
            lambda: Delivery.objects.filter(target__name="flaky", status="retrying").count() == 1,
            message="one of the flaky target's deliveries retrying",
        )

        # Find one by its provider id, one by payload text.
        journey.go("/admin/deliveries/event/")
        page.fill("#searchbar", "gh-1")
        page.keyboard.press("Enter")
        page.wait_for_url("**q=gh-1**")
        listed = page.inner_text("#result_list")
        assert sent["cus_needle"][:8] in listed and sent["cus_alpha"][:8] not in listed
        journey.step("4-found-by-provider-id")
        journey.go("/admin/deliveries/event/?search_in=payload&q=cus_omega")
        assert "Searched the payload of the 3 newest events" in page.inner_text("#wh-search-note")
        listed = page.inner_text("#result_list")
        assert sent["cus_omega"][:8] in listed and sent["cus_needle"][:8] not in listed
        assert "push" in listed
        journey.step("5-found-by-payload")

        # The event whose flaky delivery met the 503 (deliveries of the three events
        # race each other to the sink): its deliveries first, that one waiting.
        first = str(Delivery.objects.get(target__name="flaky", status="retrying").event.code)
        journey.go(f"/admin/deliveries/event/?q={first[:8]}")
        page.click(f"#result_list a:text('{first[:8]}')")
        page.wait_for_selector(".wh-table")
        assert "retrying" in page.inner_text(".wh-table").lower()
        journey.step("6-event")
        page.click(".wh-table a:text('flaky')")
        page.wait_for_selector(".wh-attempt")
        assert "Response 503" in page.inner_text(".wh-attempt")
        journey.step("7-delivery")

        # Retry now: the delivery's page reloads itself until the attempt is in...
        with page.expect_navigation():  # the button posts, then the page comes back
            page.click("button:text('Retry now')")
        page.wait_for_selector("text=It will be attempted now.")
        page.wait_for_selector(".wh-attempt:has-text('Response 200')", timeout=30_000)
        assert not page.locator("meta[http-equiv=refresh]").count()  # delivered: still
        journey.step("7b-delivery-delivered")
        # ...then watch the dashboard, which refreshes its figures in place.
        journey.go("/admin/")
        # A mark on the page that a reload would wipe: the figures change under it.
        page.evaluate("window.stayed = document.getElementById('wh-dashboard').dataset.updated")
        page.wait_for_function(
            "document.getElementById('wh-dashboard').dataset.updated !== window.stayed"
            " && document.getElementById('wh-count-delivered').textContent.trim() === '6'",
            timeout=30_000,
        )
        assert "running" in page.inner_text("#wh-engine")
        journey.step("8-dashboard-delivered")
        flaky = Delivery.objects.get(target__name="flaky", event__code=first)
        assert (flaky.status, flaky.attempts) == ("delivered", 2)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{width}-failure.png"), full_page=True)
        raise
    finally:
        page.close()
        engine.stop()
        web.stop()
    assert len(sink.requests("/flaky")) == 4  # 503, then 200 for all three


def test_a_targets_filters_as_rows_and_its_transform_tried_on_an_event(
    browser, sink, data_dir, settings
):
    """On a target's page: the filters are rows, "deliver only these event types"
    offers the types seen, and "Run on this event" shows what the program reads
    and what the target would be sent, before anything is saved."""
    from tests.support.engines import store

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    admin = User.objects.create_superuser("admin", password=PASSWORD)
    hook = Webhook.objects.create(name="Shaped", owner=admin)
    hook.ensure_entrypoint()
    target = hook.targets.create(
        name="receiver",
        type="http",
        config={"url": sink.url("/in")},
        filters=[{"source": "header", "name": "X-Env", "op": "equals", "value": "prod"}],
    )
    [event] = store(hook.entrypoints.get(), body=b'{"id": "evt_1", "amount": 12}')
    Event.objects.filter(pk=event.pk).update(event_type="charge.succeeded")
    web, base = start_web(data_dir, workers=1)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(20_000)
    journey = Journey(page, base, 1440)
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        journey.log_in()
        journey.go(f"/admin/deliveries/target/{target.pk}/change/")

        # Reveal shows the signing secret (its button was also taken for a Copy
        # button: it copied "undefined" and came back as "Copy").
        page.click("button.wh-reveal")
        assert page.inner_text("button.wh-reveal") == "Hide"
        assert page.inner_text(f"#wh-secret-{target.pk}") == target.signing_secret

        rows = page.locator(".wh-filter-row")
        assert rows.count() == 1
        assert rows.first.locator("input").first.input_value() == "X-Env"
        rows.first.locator("button:text('Remove')").click()
        page.check(".wh-filter-type input[value='charge.succeeded']")
        page.click("button:text('Deliver only these event types')")
        assert rows.count() == 1

        page.fill("#id_transform", "{body: {id: .body.id, cents: (.body.amount * 100)}}")
        page.click("button:text('Run on this event')")
        page.wait_for_selector(".wh-preview-output:has-text('cents')")
        sent = page.inner_text(".wh-preview-output")
        assert '{"id": "evt_1", "cents": 1200}' in sent
        assert "Content-Type: application/json" in sent
        assert '"amount": 12' in page.inner_text(".wh-preview-input")
        journey.step("9-target-transform")

        page.fill("#id_transform", "{body: .nope")  # a syntax error, shown, not saved
        page.click("button:text('Run on this event')")
        page.wait_for_selector(".wh-preview-status:has-text('syntax error')")
        page.fill("#id_transform", "{body: {id: .body.id}}")
        with page.expect_navigation():
            page.click("[name=_continue]")
        target.refresh_from_db()
        assert target.transform == "{body: {id: .body.id}}"
        assert target.filters == [
            {"source": "event", "name": "type", "op": "one_of", "value": ["charge.succeeded"]}
        ]
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "target-failure.png"), full_page=True)
        raise
    finally:
        page.close()
        web.stop()
