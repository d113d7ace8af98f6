"""Browser fixtures: Debian's Chromium driven by Playwright against pytest-django's live server.

Every request a page makes is recorded, and a test fails if any went to a host other than
the live server: the pages must work with no CDN and no outside network. After each test the
ledger must verify clean, as `gpumarket verify-ledger` checks it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page(live_server, monkeypatch) -> Iterator[object]:
    """A fresh Chromium on the live server; asserts afterwards that every request the page
    made went to the live server, and that the Content-Security-Policy blocked nothing.

    Chromium is started per test, after the live server and stopped before it: Playwright's
    sync API keeps an asyncio loop in this thread while it runs, which Django's ORM guard
    takes for an async context, so the database flush at teardown must come after it stops.
    """
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Chromium is required at {CHROMIUM}: apt-get install -y chromium chromium-driver",
            pytrace=False,
        )
    # The test's own ORM calls between browser steps are ordinary synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    server = urlsplit(live_server.url)
    requests: list[str] = []
    blocked: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(
            base_url=live_server.url, accept_downloads=True, viewport={"width": 1280, "height": 900}
        )
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on("request", lambda request: requests.append(request.url))
        # Chromium reports what the Content-Security-Policy blocked on the console.
        page.on(
            "console",
            lambda message: (
                blocked.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )
        yield page
        context.close()
        browser.close()
    outside = [
        url
        for url in requests
        if urlsplit(url).scheme not in ("data", "blob")
        and (urlsplit(url).hostname, urlsplit(url).port) != (server.hostname, server.port)
    ]
    assert requests, "the page made no request at all"
    assert not outside, f"requests left the live server: {outside}"
    assert not blocked, f"the Content-Security-Policy blocked: {blocked}"
    # Whatever the flow did to money, `gpumarket verify-ledger` is clean after it (it raises
    # CommandError naming each broken invariant).
    out = io.StringIO()
    call_command("verify_ledger", stdout=out)
    assert "ledger clean" in out.getvalue()


def login(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
