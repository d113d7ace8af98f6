"""Pages every role meets: the navigation, the icon, the not-found page, the token box."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from tests import factories

pytestmark = pytest.mark.django_db


def test_a_researcher_has_a_link_to_planned_demand(client):
    client.force_login(factories.member(tenant=factories.tenant()))
    page = client.get("/").content.decode()
    assert f'<a href="{reverse("planned_campaigns")}">Planned demand</a>' in page


def test_favicon_is_served_from_our_static_files(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")
    assert finders.find("favicon.svg")


def test_a_missing_page_is_our_not_found_page_not_a_bare_one(client, settings):
    settings.DEBUG = False
    client.force_login(factories.member(tenant=factories.tenant()))
    response = client.get("/no/such/page/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "<h1>Not found</h1>" in body and "Back to the dashboard" in body
    assert 'class="main-nav"' in body  # the site's layout, with its navigation


def test_the_new_token_box_copies_with_our_own_script_not_an_inline_handler(client):
    client.force_login(factories.member(tenant=factories.tenant()))
    page = client.post(reverse("api_tokens"), {"name": "laptop"}, follow=True).content.decode()
    assert 'data-testid="new-token"' in page
    assert "onfocus=" not in page and "onclick=" not in page
    assert 'data-copy="new-token"' in page and "/static/js/copy.js" in page
    assert finders.find("js/copy.js")
