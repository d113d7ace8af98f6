"""docs/architecture.md holds the code to its word: the import direction it draws, and a
name for every app, management command, URL prefix and Celery task the code has.

The direction is read from the doc's diagram, so the doc and the code cannot drift apart:
adding an app means placing it in the diagram, and an import against the arrow fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def _layers() -> list[str]:
    """The apps in the diagram's first line, lowest first: ``core  <-  audit  <-  ...``."""
    block = DOC.split("```", 2)[1]
    line = next(line for line in block.splitlines() if "<-" in line)
    return [name.strip() for name in line.split("<-")]


LAYERS = _layers()
RANK = {name: rank for rank, name in enumerate(LAYERS)}
# Pure rooms: no Django, no app, not even core.
PURE = {"market/clearing": "the solver", "telemetry/agent": "the node program"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _sources(app: str) -> list[Path]:
    return sorted(p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts)


def test_the_diagram_names_every_local_app():
    from django.conf import settings

    local = [app for app in settings.INSTALLED_APPS if (ROOT / app).is_dir()]
    assert set(local) <= set(LAYERS), f"apps missing from the diagram: {set(local) - set(LAYERS)}"
    assert "core" in LAYERS and LAYERS[0] == "core"


@pytest.mark.parametrize("app", LAYERS)
def test_an_app_imports_only_the_apps_to_its_left(app):
    wrong = []
    for path in _sources(app):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top == "config" or RANK.get(top, -1) > RANK[app]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "imports against the arrow of docs/architecture.md:\n" + "\n".join(wrong)


@pytest.mark.parametrize("room", sorted(PURE))
def test_the_pure_rooms_import_no_django_and_no_app(room):
    wrong = []
    for path in sorted((ROOT / room).rglob("*.py")):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top in {"django", "rest_framework", "celery", "config"} or top in RANK:
                if not module.startswith(room.replace("/", ".")):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, f"{PURE[room]} must stay pure:\n" + "\n".join(wrong)


@pytest.mark.parametrize("app", LAYERS)
def test_services_queue_tasks_by_name_and_never_import_views(app):
    """A service sends a task by its name (``send_task``/``signature``): the tasks module
    imports the services, never the other way round. Selectors read and import no service."""
    wrong = []
    for path in _sources(app):
        rel = path.relative_to(ROOT).as_posix()
        is_service = "/services/" in rel or rel.endswith("/services.py")
        is_selector = rel.endswith("selectors.py") or "/selectors/" in rel
        if not (is_service or is_selector):
            continue
        for line, module in _imports(path):
            last = module.split(".")
            upward = {"tasks", "views", "staff_views", "forms", "api"} & set(last[1:])
            if upward or (is_selector and "services" in last[1:]):
                wrong.append(f"{rel}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def _named(name: str) -> bool:
    return name in DOC


def test_every_management_command_is_named():
    commands = sorted(
        path.stem
        for app in LAYERS
        for path in (ROOT / app).glob("**/management/commands/*.py")
        if path.stem != "__init__"
    )
    assert commands, "found no management command: the search is wrong"
    missing = [c for c in commands if not _named(c.replace("_", "-")) and not _named(c)]
    assert not missing, f"commands not in docs/architecture.md: {missing}"


def test_every_celery_task_is_named():
    from config.celery import app

    app.loader.import_default_modules()
    ours = sorted(name for name in app.tasks if name.split(".")[0] in RANK)
    assert "market.rounds_tick" in ours, "the app's tasks were not registered: the search is wrong"
    missing = [name for name in ours if f"`{name}`" not in DOC]
    assert not missing, f"Celery tasks not in docs/architecture.md: {missing}"


def _prefixes() -> list[str]:
    """Every URL the site mounts, down to an API resource: ``/market/``, ``/api/v1/bids``."""
    from django.urls import URLPattern, URLResolver, get_resolver

    found: set[str] = set()

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            route = prefix + str(entry.pattern).lstrip("^").rstrip("$")
            if isinstance(entry, URLResolver) and route.startswith("api/"):
                walk(entry.url_patterns, route)
            elif isinstance(entry, URLResolver):
                found.add("/" + route)
            elif isinstance(entry, URLPattern) and route.startswith("api/"):
                head = re.match(r"api/v\d+/[a-z_-]+", route)
                if head:
                    found.add("/" + head.group(0))
            elif isinstance(entry, URLPattern) and not route.startswith("admin/"):
                found.add("/" + route.split("/")[0])

    walk(get_resolver().url_patterns, "")
    return sorted(p for p in found if p not in {"/", "/admin/", "/api/schema"})


def test_every_url_prefix_is_named():
    prefixes = _prefixes()
    assert "/market/" in prefixes and "/api/v1/bids" in prefixes, prefixes
    # The doc may name an API resource by its plain word inside a list of them.
    missing = [
        p
        for p in prefixes
        if p not in DOC
        and p.rstrip("/") not in DOC
        and f"`{p.rstrip('/').rsplit('/', 1)[-1]}`" not in DOC
    ]
    assert not missing, f"URL prefixes not in docs/architecture.md: {missing}"


def _view_modules() -> list[Path]:
    return sorted(
        path
        for app in LAYERS
        for path in (ROOT / app).rglob("*.py")
        if path.name in {"views.py", "staff_views.py"} or path.name.endswith("_views.py")
    )


def test_views_read_through_selectors():
    """A view's only query of its own is the lookup of one row by its key
    (``get_object_or_404``, ``access_object``); a DRF ``queryset`` attribute or
    ``base_queryset`` is a definition the framework scopes; ``.none()`` reads nothing. Every
    list, filter or join is a named selector."""
    assert _view_modules(), "found no view module: the search is wrong"
    wrong = []
    for path in _view_modules():
        tree = ast.parse(path.read_text())
        allowed: set[int] = set()
        for node in ast.walk(tree):
            lookup = isinstance(node, ast.Call) and getattr(node.func, "id", None) in {
                "get_object_or_404",
                "access_object",
            }
            definition = (
                isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "queryset" for t in node.targets)
            ) or (isinstance(node, ast.FunctionDef) and node.name == "base_queryset")
            if lookup or definition:
                allowed |= {id(sub) for sub in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
                on_manager = isinstance(target, ast.Attribute) and target.attr == "objects"
                if on_manager and node.func.attr != "none" and id(target) not in allowed:
                    wrong.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} .objects.{node.func.attr}"
                    )
    assert not wrong, "queries in views (move them into the app's selectors):\n" + "\n".join(wrong)
