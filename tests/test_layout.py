"""The architecture's rules, checked on the source (docs/architecture.md): backends never
import the gateway, no store imports the pipeline or a layer, and no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("authn_gateway", "backends")
# Modules that hold a layer's state: they serve the layers, never the other way round.
STORES = [
    "authn_gateway.fleet.stores",
    *(
        f"authn_gateway.layers.{layer}.{kind}"
        for layer in ("cache", "breaker", "bucket", "coalesce")
        for kind in ("memory", "redis")
    ),
]
ABOVE_STORES = (
    "authn_gateway.review.pipeline",
    "authn_gateway.review.stack",
    "authn_gateway.serve.gateway",
)
# Packages whose ``if TYPE_CHECKING:`` imports count for cycles too: a cycle that only
# type-checking hides is still a knot a reader has to untie (issue 31). The whole tree
# once the edge's cycle ↔ protocol knot is gone.
TYPE_CHECKING_COUNTS = ("authn_gateway.layers.breaker",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(
    tree: ast.Module, module_level: bool, type_checking: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    if not module_level:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    # What runs at import time: top-level statements, outside ``if TYPE_CHECKING:``
    # (unless ``type_checking``: then those count too).
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and (
            type_checking or "TYPE_CHECKING" not in ast.unparse(node.test)
        ):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
    return found


def imports_of(path: Path, module_level: bool = False) -> set[str]:
    """The modules of ours that ``path`` imports (all, or those imported at import time,
    with type-checking ones in the packages of :data:`TYPE_CHECKING_COUNTS`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    type_checking = name.startswith(TYPE_CHECKING_COUNTS)
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), module_level, type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            anchor = parts[: len(parts) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        found.add(base)
        found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _graph(module_level: bool) -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    return {
        name: {m for m in imports_of(p, module_level) if m in modules}
        for name, p in modules.items()
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Every import, function-level and type-checking ones included."""
    return _graph(module_level=False)


def test_backends_never_import_the_gateway(graph: dict[str, set[str]]) -> None:
    offenders = {
        name: sorted(m for m in deps if m.startswith("authn_gateway"))
        for name, deps in graph.items()
        if name.startswith("backends")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_store_imports_the_pipeline_or_a_layer(graph: dict[str, set[str]]) -> None:
    for store in STORES:
        assert store in graph, f"{store} is listed in docs/architecture.md but does not exist"
        bad = sorted(m for m in graph[store] if m.startswith(ABOVE_STORES) or m.endswith(".layer"))
        assert bad == [], f"{store} imports {bad}"


def test_no_import_cycle() -> None:
    """No cycle among the imports that run at import time, and, in the packages of
    TYPE_CHECKING_COUNTS, the type-checking ones. (A function-level import, such as
    KeystoneSettings.build importing its backend, runs later, once both exist.)"""
    cycle = cycle_in(_graph(module_level=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_behind_type_checking_is_found_in_the_breaker_package() -> None:
    """The check above sees an ``if TYPE_CHECKING:`` import in the breaker package (the
    knot machine -> memory -> override -> machine hid behind one), and only there."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .machine import X\n"
    tree = ast.parse(source)
    assert len(_import_nodes(tree, module_level=True, type_checking=True)) == 2
    assert len(_import_nodes(tree, module_level=True, type_checking=False)) == 1
    graph = {
        "authn_gateway.layers.breaker.machine": {"authn_gateway.layers.breaker.memory"},
        "authn_gateway.layers.breaker.memory": {"authn_gateway.layers.breaker.override"},
        "authn_gateway.layers.breaker.override": {"authn_gateway.layers.breaker.machine"},
    }
    assert cycle_in(graph) == [
        "authn_gateway.layers.breaker.machine",
        "authn_gateway.layers.breaker.memory",
        "authn_gateway.layers.breaker.override",
        "authn_gateway.layers.breaker.machine",
    ]


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle found in ``graph``, as a path that ends where it starts."""

    # Package __init__ modules re-export their children: an edge from a child back to its
    # own package is an import of a sibling, not a cycle.
    def edges(name: str) -> set[str]:
        return {m for m in graph.get(name, ()) if not name.startswith(m + ".")}

    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(edges(name)):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found is not None:
                    return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found is not None:
                return found
    return None
