"""A real browser builds a webhook in the admin and watches its delivery arrive.

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

from deliveries.models import Delivery, Webhook
from tests.processes import start_engine, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"
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
        yield browser
        browser.close()


def test_build_a_webhook_in_the_browser_and_see_it_delivered(browser, sink, data_dir, settings):
    # The gunicorn process checks the password with the real hashers.
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    User.objects.create_superuser("admin", password="browser-pw-123!")
    env = {"DELIVERY_POLL_INTERVAL": "0.2"}
    web, base = start_web(data_dir, workers=1, **env)
    engine = start_engine(data_dir, **env)
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(20_000)
    try:
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "browser-pw-123!")
        page.click("input[type=submit]")
        page.wait_for_selector("#wh-dashboard")

        page.goto(f"{base}/admin/deliveries/webhook/add/")
        page.fill("#id_name", "From the browser")
        page.click("#targets-group .add-row a")
        page.fill("#id_targets-0-name", "sink")
        page.select_option("#id_targets-0-type", "http")
        page.fill("#id_targets-0-url", sink.url("/browser"))
        page.fill("#id_targets-0-max_retries", "3")
        page.click("input[name=_continue]")
        page.wait_for_selector(".wh-url")
        inbound = page.inner_text(".wh-url")

        hook = Webhook.objects.get(name="From the browser")
        assert inbound == f"{base}/webhook/{hook.entrypoints.get().code}"
        response = requests.post(inbound, json={"from": "test"}, timeout=10)
        assert response.status_code == 200
        event_code = response.json()["event"]

        page.goto(f"{base}/admin/deliveries/delivery/")
        for _ in range(100):
            if page.locator("#result_list .wh-badge", has_text="delivered").count():
                break
            page.wait_for_timeout(200)
            page.reload()
        assert page.locator("#result_list .wh-badge", has_text="delivered").count() == 1
        assert event_code in page.inner_text("#result_list")

        delivery = Delivery.objects.get()
        page.goto(f"{base}/admin/deliveries/delivery/{delivery.pk}/change/")
        assert "200" in page.inner_text(".inline-group")
        page.screenshot(path=str(ARTIFACTS / "delivery.png"), full_page=True)

        page.goto(f"{base}/admin/deliveries/event/{delivery.event_id}/change/")
        assert '"from": "test"' in page.inner_text(".wh-body")
        page.screenshot(path=str(ARTIFACTS / "event.png"), full_page=True)

        page.goto(f"{base}/admin/")
        assert page.inner_text("#wh-count-delivered") == "1"
        assert "running" in page.inner_text("#wh-engine")
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

        # Redeliver it from the list: the running engine is woken and sends it again.
        page.goto(f"{base}/admin/deliveries/delivery/")
        page.check("#result_list input.action-select")
        page.select_option("select[name=action]", "redeliver")
        page.click("button[name=index]")
        assert "Queued 1 deliveries for redelivery." in page.inner_text(".messagelist")
        sink.wait_for(2, "/browser", timeout=20)
        wait_until(
            lambda: Delivery.objects.filter(status="delivered", attempts=2).exists(),
            message="the redelivery recorded",
        )
        assert delivery.results.count() == 2
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
        raise
    finally:
        page.close()
        engine.stop()
        web.stop()
    assert [r.body for r in sink.requests("/browser")] == [b'{"from": "test"}'] * 2
