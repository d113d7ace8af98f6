"""The Content-Security-Policy: scripts only from our own files or inline with the request's
nonce; every inline script a page carries has that nonce."""

from __future__ import annotations

import re

import pytest

from tests import factories

pytestmark = pytest.mark.django_db


def test_pages_send_a_nonce_policy_and_every_inline_script_carries_the_nonce(client):
    tenant = factories.tenant(credits=1000)
    client.force_login(factories.member(tenant=tenant))
    response = client.get("/market/")
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src"))
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    nonce = re.search(r"'nonce-([^']+)'", script_src).group(1)
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    html = response.content.decode()
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html)
    assert inline, "the market page has inline scripts (the countdown at least)"
    assert all(f'nonce="{nonce}"' in attrs for attrs in inline), inline


def test_the_api_docs_page_needs_no_inline_script(client):
    client.force_login(factories.admin_user())
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert not re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", response.content.decode())
