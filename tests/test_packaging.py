"""The package as it is shipped: a wheel built from the checkout and installed non-editable
into a fresh virtualenv, outside the source tree (the editable install in .venv would hide a
module, template or static file the wheel leaves out).

The fresh virtualenv gets no dependencies of its own: a .pth file written *after* the wheel is
installed puts the project virtualenv's site-packages behind its own, so Django, numpy and the
rest are imported from there while every gpumarket module comes from the wheel. A path in a
.pth file is not a site directory, so the editable install's own .pth there is never run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent

# Run in the wheel's virtualenv: where each first-party module, a template and a static file
# were loaded from, one per line.
PROBE = """
import django
django.setup()
import importlib
from django.contrib.staticfiles import finders
from django.template.loader import get_template
for name in {apps!r}:
    print(importlib.import_module(name).__file__)
print(get_template("base.html").origin.name)
print(finders.find("css/site.css"))
"""


def _include_patterns() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]


def _project_apps() -> list[str]:
    """The top-level modules of INSTALLED_APPS that live in this repository."""
    tops = {app.name.split(".")[0] for app in apps.get_app_configs()}
    return sorted(top for top in tops if (ROOT / top / "__init__.py").is_file())


def test_package_list_covers_every_installed_app():
    patterns = _include_patterns()
    missing = [app for app in _project_apps() if not any(fnmatch(app, p) for p in patterns)]
    assert not missing, f"pyproject.toml's package list leaves out installed apps: {missing}"


def _run(args: list, *, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


def _checkout(dest: Path) -> None:
    """Copy what a clean checkout holds (tracked files and new, not ignored ones)."""
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("needs git and a git checkout to know which files a clean checkout holds")
    tmp = tmp_path_factory.mktemp("packaging")
    _checkout(tmp / "src")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", tmp / "src"])
    (wheel,) = (tmp / "dist").glob("gpumarket-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel])
    site = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    (site / "zz_project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    env.update(
        DEBUG="0",
        SECRET_KEY="packaging-test-" + "x" * 40,
        GPUMARKET_AUDIT_KEYS="k1:" + "0" * 64,
        GPUMARKET_METRICS_TOKEN="packaging-test",
        GPUMARKET_VAR_DIR=str(tmp / "var"),
        DATABASE_URL=f"sqlite:///{tmp / 'var' / 'gpumarket.sqlite3'}",
        STATIC_ROOT=str(tmp / "staticfiles"),
        CELERY_BROKER_URL="memory://",
        CACHE_URL="",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    return env


def test_wheel_runs_check_and_migrate_outside_the_source_tree(wheel_venv, tmp_path):
    env = _env(tmp_path)
    gpumarket = wheel_venv / "bin" / "gpumarket"  # the installed manage.py
    # Warnings fail too: a STATICFILES_DIRS entry the wheel does not ship is only a warning.
    _run([gpumarket, "check", "--fail-level", "WARNING"], cwd=tmp_path, env=env)
    _run([gpumarket, "migrate", "--noinput"], cwd=tmp_path, env=env)
    _run([gpumarket, "migrate", "--check"], cwd=tmp_path, env=env)
    _run([gpumarket, "collectstatic", "--noinput"], cwd=tmp_path, env=env)

    probe = PROBE.format(apps=[*_project_apps(), "core", "gpumarket"])
    loaded = _run([wheel_venv / "bin" / "python", "-c", probe], cwd=tmp_path, env=env)
    paths = [Path(line) for line in loaded.stdout.split()]
    outside = [p for p in paths if not p.resolve().is_relative_to(wheel_venv.resolve())]
    assert not outside, f"loaded from outside the wheel's virtualenv: {outside}"
    assert len(paths) == len(_project_apps()) + 4
