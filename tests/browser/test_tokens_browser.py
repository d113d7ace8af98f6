"""In Chromium: a new API token is copied by its Copy button, which the CSP lets run (an
inline handler would be refused; the page fixture fails on any CSP report)."""

from __future__ import annotations

import pytest

from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-token-123"


def test_the_new_token_is_selected_by_its_copy_button(page, live_server):
    factories.member(tenant=factories.tenant(name="Vision Lab"), username="ada", password=PASSWORD)
    login(page, "ada", PASSWORD)
    page.goto("/tokens/")
    page.fill("input[name=name]", "laptop")
    page.click("button:has-text('Create token')")
    token = page.input_value("[data-testid=new-token]")
    assert token.startswith("gm_")
    page.click("[data-testid=copy-token]")
    # The clipboard answers asynchronously; the label changes when it has.
    page.wait_for_function(
        "() => document.querySelector('[data-testid=copy-token]').textContent !== 'Copy'"
    )
    label = page.inner_text("[data-testid=copy-token]")
    assert label in ("Copied", "Selected: press Ctrl+C")
    selected = page.evaluate(
        "() => { const f = document.getElementById('new-token');"
        " return f.value.substring(f.selectionStart, f.selectionEnd); }"
    )
    assert selected == token
    shot(page, "15-new-token-copied")
