"""The architecture's rules, checked on the source (docs/architecture.md, "Rules"):
backends never import the gateway, no store imports the pipeline or a layer, and no
import cycle, whether the import runs at import time, in a function or only for the
type checker."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("authn_gateway", "backends")
# Modules that hold a layer's state: they serve the layers, never the other way round.
STORES = [
    "authn_gateway.review.stores",
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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, name: str, is_package: bool, modules: Collection[str]) -> set[str]:
    """The modules of ours that module ``name`` imports, with every import statement
    counted: at module level, in a function, under ``if TYPE_CHECKING:``. A knot that
    a function-level or type-checking import closes is still a knot a reader has to
    untie (issue 31). ``from P import n`` imports the module ``P.n`` if there is one,
    else a name of ``P`` (its ``__init__``)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    return {
        name: imports_in(p.read_text(), name, p.name == "__init__.py", paths)
        for name, p in paths.items()
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (see :func:`imports_in`)."""
    return _graph()


def what_runs(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with the packages an import runs first: importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__``, unless they hold the importer (then they run
    already; a name imported from one still counts)."""
    runs: dict[str, set[str]] = {}
    for name, deps in graph.items():
        runs[name] = {dep for dep in deps if dep != name}
        for dep in deps:
            parts = dep.split(".")
            for i in range(1, len(parts)):
                package = ".".join(parts[:i])
                if package in graph and package != name and not name.startswith(package + "."):
                    runs[name].add(package)
    return runs


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


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    """No cycle among the imports of authn_gateway and backends: every import counts,
    a function's and a type checker's too, and a package's ``__init__`` runs before any
    module in it. (Fix a cycle by moving what both sides need, a Protocol or a
    constant, where both can import it; not by hiding the import.)"""
    cycle = cycle_in(what_runs(graph))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_behind_type_checking_or_in_a_function_is_found() -> None:
    """The check above sees an import under ``if TYPE_CHECKING:`` and one inside a
    function (the knots once hidden that way: breaker machine -> memory -> override ->
    machine; edge protocol -> connection -> cycle -> protocol; keystone settings ->
    backend), and a package's ``__init__`` run by an import of a module in it."""
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "other"}
    type_checking = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
    in_a_function = "def build():\n    from pkg.c import Y\n    return Y()\n"
    assert imports_in(type_checking, "pkg.a", False, modules) == {"pkg.b"}
    assert imports_in(in_a_function, "pkg.b", False, modules) == {"pkg.c"}
    assert imports_in("from pkg import a, helper\n", "other", False, modules) == {"pkg.a", "pkg"}
    graph = {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a"},
        "other": set(),
    }
    assert cycle_in(what_runs(graph)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    # A module outside the package runs its __init__; one inside does not.
    assert what_runs({"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": set(), "other": {"pkg.a"}}) == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": set(),
        "other": {"pkg", "pkg.a"},
    }
    # pkg.c imports a name of pkg, whose __init__ imports pkg.a: a cycle through it.
    graph["pkg.c"] = {"pkg"}
    assert cycle_in(what_runs(graph)) == ["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg"]


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle found in ``graph``, as a path that ends where it starts."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph.get(name, ())):
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
