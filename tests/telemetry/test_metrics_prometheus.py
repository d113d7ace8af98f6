"""Debian's real Prometheus scrapes the live app with deploy/prometheus/'s configuration, and
promtool checks the exposition, the rules (with their unit tests) and the configuration; the
Grafana dashboard's queries are run against that Prometheus. Installed by scripts/prometheus.sh.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import yaml
from django.conf import settings
from django.utils import timezone

from telemetry.models import Gpu, Sample
from tests import factories
from tests.conftest import ROOT, free_port
from tests.telemetry.live import wait_until

DEPLOY = ROOT / "deploy"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required: run `bash scripts/prometheus.sh`", pytrace=False)
    return path


def _promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [_tool("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _series_names(text: str) -> set[str]:
    return set(re.findall(r"\bgpumarket_[a-z0-9_]+", text))


@pytest.fixture
def prometheus(server, tmp_path):
    """Prometheus on a free port scraping ``server`` every second with the shipped scrape job
    (its target, scheme and token file pointed at the test's), the shipped rules loaded."""
    token = tmp_path / "token"
    token.write_text(settings.GPUMARKET_METRICS_TOKEN)
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job = config["scrape_configs"][0]
    job.update(scheme="http", scrape_timeout="1s")
    job["authorization"]["credentials_file"] = str(token)
    job["static_configs"] = [{"targets": [server.url.removeprefix("http://")]}]
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            _tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        assert wait_until(ready, timeout=60), (tmp_path / "prometheus.log").read_text()
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _query(url: str, expr: str) -> list[dict]:
    body = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_prometheus_scrapes_the_live_app_and_the_deploy_files_hold(prometheus, server, tier, node):
    team = factories.tenant(name="Vision", credits=1_234_567)
    node.healthy = True
    node.save(update_fields=["healthy"])
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-live", index=0, name="A100", tier=tier, memory_total_mib=81920
    )
    Sample.objects.create(
        gpu=gpu,
        at=timezone.now() + timedelta(seconds=30),  # fresh for the whole test
        utilization_pct=73.5,
        memory_used_mib=2048,
        memory_total_mib=81920,
        power_w=250,
        temperature_c=55,
        energy_j=1.0,
    )

    def target_up() -> bool:
        body = requests.get(f"{prometheus}/api/v1/targets", timeout=5).json()
        targets = body["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def has(expr: str) -> list[dict]:
        return _query(prometheus, expr)

    assert wait_until(target_up, timeout=60, step=0.5), requests.get(
        f"{prometheus}/api/v1/targets", timeout=5
    ).text
    util = 'gpumarket_gpu_utilization_percent{uuid="GPU-live",node="n1",tier="a100"}'
    assert wait_until(lambda: bool(has(util)), timeout=30, step=0.5)
    assert float(has(util)[0]["value"][1]) == 73.5
    available = f'gpumarket_team_available_millicredits{{team="{team.slug}"}}'
    assert float(has(available)[0]["value"][1]) == 1_234_567

    # Every rule loaded and evaluated without error.
    def rules_evaluated() -> bool:
        groups = requests.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return len(rules) >= 10 and all(
            r["health"] == "ok" and r.get("lastEvaluation", "0001").startswith("20") for r in rules
        )

    assert wait_until(rules_evaluated, timeout=30, step=0.5), requests.get(
        f"{prometheus}/api/v1/rules", timeout=5
    ).text

    exposition = requests.get(
        f"{server.url}/metrics",
        headers={"Authorization": f"Bearer {settings.GPUMARKET_METRICS_TOKEN}"},
        timeout=30,
    ).text
    _promtool("check", "metrics", stdin=exposition)
    scraped = {
        name
        for line in exposition.splitlines()
        if line.startswith("# TYPE ")
        for name in [line.split()[2]]
    }

    # Rules: promtool's check and its unit tests; every series they name is one we serve.
    _promtool("check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    _promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
    rules_text = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    assert _series_names(rules_text) <= scraped, _series_names(rules_text) - scraped

    # The dashboard: every query is valid PromQL here (variables set to match all), names
    # only series we serve, and every time series panel labels its axis.
    dashboard = json.loads((DEPLOY / "grafana" / "gpumarket.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert _series_names(" ".join(exprs)) <= scraped, _series_names(" ".join(exprs)) - scraped
    for expr in exprs:
        _query(prometheus, expr.replace("$tier", ".*").replace("$team", ".*"))
    for p in panels:
        if p["type"] == "timeseries":
            assert p["fieldConfig"]["defaults"]["custom"]["axisLabel"], p["title"]
    assert has(f'gpumarket_team_gpu_seconds_allocated_24h{{team="{team.slug}"}}')
