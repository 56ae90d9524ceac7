"""The project's modules import one another without a cycle, and the layers point one way:
``adapters`` -> ``bot`` -> ``pipelines``.

Every import counts: those inside functions (a cycle hidden in a function is still a cycle) and those
under ``if TYPE_CHECKING:`` (they never run, but a cycle that only type checking sees is still two
modules that cannot be understood apart)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("adapters", "bot", "pipelines")
LAYER = {"adapters": 2, "bot": 1, "pipelines": 0}


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        found = {module_of(imported) for imported in imported_names(ast.parse(path.read_text(encoding="utf-8")))}
        graph[name] = {m for m in found if m is not None and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    assert len(graph) > 50 and "bot.conversation" in graph["adapters.slack.platform"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_and_in_function_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bot.x\nelse:\n"
                     "    import bot.y\ndef f():\n    import bot.z\n")
    assert sorted(imported_names(tree)) == ["bot.x", "bot.y", "bot.z", "typing.TYPE_CHECKING"]


@pytest.mark.parametrize("package", PACKAGES)
def test_layers_import_only_downwards(package):
    upward = sorted(f"{name} -> {other}" for name, deps in import_graph().items() if name.split(".")[0] == package
                    for other in deps if LAYER[other.split(".")[0]] > LAYER[package])
    assert upward == []


#: ``bot/`` drawn as floors, lowest first: a part imports only parts on its own floor or below. The
#: vocabulary (types, words, errors, logs, metrics, who may read what) under the settings, state (what is
#: kept: locks, claims, history, caches, the turn log; memory and Redis versions), the turn, delivery (a
#: turn's life on a chat platform), knowledge (refresh, its loop, insights), the platform contract, the
#: conversation service and the composition root.
BOT_FLOORS = [
    {"bot", "bot.types", "bot.errors", "bot.messages", "bot.logs", "bot.metrics", "bot.permissions"},
    {"bot.settings"},
    {"bot.state"},
    {"bot.turn"},
    {"bot.delivery"},
    {"bot.knowledge"},
    {"bot.platform"},
    {"bot.preference_commands", "bot.conversation"},
    {"bot.runtime"},
]
#: Inside a package of ``bot/``, its parts' floors likewise (those not listed import none of the others).
PART_FLOORS = {
    "bot.knowledge": ["refresh", "loop", "status", ("insights", "scheduler")],
    "bot.delivery": ["buckets", "rates", "stream", "reply", "pending", ("redis_pending", "turns"), "gate"],
}


def floor_of(module: str, floors: list[Any]) -> int | None:
    for i, floor in enumerate(floors):
        names = {floor} if isinstance(floor, str) else set(floor)
        if any(module == name or module.startswith(name + ".") for name in names):
            return i
    return None


def test_bot_parts_import_only_their_floor_or_below():
    graph = import_graph()
    assert all(floor_of(m, BOT_FLOORS) is not None for m in graph if m.split(".")[0] == "bot"), \
        "every module of bot/ is on a floor"
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.split(".")[0] == "bot" for d in deps
                    if d.split(".")[0] == "bot" and floor_of(d, BOT_FLOORS) > floor_of(m, BOT_FLOORS))
    assert upward == []


@pytest.mark.parametrize("package", sorted(PART_FLOORS))
def test_a_packages_parts_import_only_their_floor_or_below(package):
    floors = [f"{package}.{p}" if isinstance(p, str) else tuple(f"{package}.{q}" for q in p)
              for p in PART_FLOORS[package]]
    graph = import_graph()
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith(package + ".") for d in deps
                    if d.startswith(package + ".") and floor_of(m, floors) is not None
                    and floor_of(d, floors) is not None and floor_of(d, floors) > floor_of(m, floors))
    assert upward == []


#: The platforms: the folders of ``adapters/`` that hold one (``platform.py``).
PLATFORM_NAMES = sorted(p.parent.name for p in (REPO / "adapters").glob("*/platform.py"))
#: Where ``bot/`` still names a platform as a value, and why.
NAMED_IN_BOT = {
    # Turn records kept before they said whether they were private are told by their channel ids.
    ("bot.state.turn_log.records", "slack"), ("bot.state.turn_log.records", "telegram"),
    # An HTTP API caller is known by its token's name (the inquiry's tenant), not by a user id.
    ("bot.permissions", "api"),
    # The HTTP API's section (bot/settings/api.py) is not a chat platform's: its callers' tokens are read
    # from the environment as the settings load, which fails on a missing one.
    ("bot.settings", "api"),
}


def test_bot_switches_on_no_platform():
    """``bot/`` holds no platform's name as a value (``== "slack"``, a default) and reads no platform's
    settings section (``settings.slack``): the registry (``adapters/platforms.py``) names them."""
    assert {"slack", "telegram", "api"} <= set(PLATFORM_NAMES)
    named = set()
    for module, path in project_modules().items():
        if module.split(".")[0] != "bot":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PLATFORM_NAMES:
                named.add((module, node.value))
            elif isinstance(node, ast.Attribute) and node.attr in PLATFORM_NAMES:
                named.add((module, node.attr))
    assert named == NAMED_IN_BOT
