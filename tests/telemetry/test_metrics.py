"""/metrics: Prometheus text, figures that follow the state; teams by slug, never by name."""

from __future__ import annotations

import re

import pytest

from market.models import Tier
from tenants.ledger import credits_grant
from tests import factories

pytestmark = pytest.mark.django_db


def _value(body: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{name}{{{re.escape(label_text)}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    match = re.search(pattern, body, re.MULTILINE)
    assert match, f"{name} {labels} not in:\n{body}"
    return float(match.group(1))


def test_metrics_follow_the_state_and_name_teams_only_by_slug(client, settings):
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {settings.GPUMARKET_METRICS_TOKEN}"
    tenant = factories.tenant(name="Secret Team Name", credits=5_000)
    Tier.objects.create(slug="a100", name="A100", capacity=6, maintenance_gpus=1)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    body = response.content.decode()
    assert "# TYPE gpumarket_rounds gauge" in body
    assert _value(body, "gpumarket_tier_offered_gpus", tier="a100") == 5
    assert _value(body, "gpumarket_ledger_balance_millicredits", kind="available") == 5_000
    assert _value(body, "gpumarket_ledger_balance_millicredits", kind="issuance") == -5_000
    before = _value(body, "gpumarket_audit_events")
    credits_grant(tenant=tenant, amount=1_000, reason="more", actor=None)
    body = client.get("/metrics").content.decode()
    assert _value(body, "gpumarket_ledger_balance_millicredits", kind="available") == 6_000
    assert _value(body, "gpumarket_audit_events") == before + 1
    assert "Secret Team Name" not in body
    # The slug appears only as the value of a team label.
    assert body.count(tenant.slug) == body.count(f'team="{tenant.slug}"') > 0


def test_metrics_token_when_configured(client, settings):
    settings.GPUMARKET_METRICS_TOKEN = "scrape-secret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert (
        client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"}).status_code == 200
    )


def test_metrics_are_closed_without_a_token_unless_debug(client, settings):
    settings.GPUMARKET_METRICS_TOKEN = ""
    settings.DEBUG = False
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
    settings.DEBUG = True
    assert client.get("/metrics").status_code == 200


def test_production_settings_refuse_to_start_without_a_metrics_token():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GPUMARKET_METRICS_TOKEN"}
    env.update(DEBUG="0", DJANGO_SETTINGS_MODULE="config.settings")
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "GPUMARKET_METRICS_TOKEN is required when DEBUG is off" in result.stderr
