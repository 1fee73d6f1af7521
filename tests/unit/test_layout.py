"""The architecture's rules, checked on the source (docs/architecture.md, "Rules"):
backends never import the gateway, each folder of authn_gateway imports only those
below it, no store imports the pipeline or a layer, and no import cycle, whether the
import runs at import time, in a function or only for the type checker."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

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

# The folders of authn_gateway, by role; its top-level modules are the foundations every
# folder may import, or the entry points that may import anything.
FOLDERS = (
    "serve",
    "edge",
    "authorization",
    "review",
    "layers",
    "revocation",
    "fleet",
    "observe",
)

FOUNDATIONS = (
    "config",
    "eager",
    "json_body",
    "keyed_hashes",
    "kube_status",
    "secret_patterns",
    "secret_strength",
    "tasks",
)

ENTRY_POINTS = ("__main__", "admin_cli", "cli", "cli_args")

# Imports that break a rule below, each until the change its comment names. Nothing else
# may: a new one is a design question, not a line to add here.
EXCEPTIONS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, a relative one resolved from ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")
    anchor = parts[: len(parts) - node.level + 1]
    return ".".join([*anchor, base] if base else anchor)


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
            base = imported_from(node, package)
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


def folder(module: str) -> str:
    """``backends``, a folder of authn_gateway (``layers``, ...) or one of its top-level
    modules (``config``, ...; ``authn_gateway`` for its ``__init__``)."""
    parts = module.split(".")
    if parts[0] == "backends":
        return "backends"
    return parts[1] if len(parts) > 1 else parts[0]


def crossings(graph: dict[str, set[str]], source: str, forbidden: Collection[str]) -> list[str]:
    """Each import from a module in folder ``source`` into one in a ``forbidden`` folder,
    as ``importer -> imported``, but for the :data:`EXCEPTIONS`."""
    return sorted(
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if folder(name) == source
        for dep in deps
        if folder(dep) in forbidden and (name, dep) not in EXCEPTIONS
    )


def assert_never_imports(graph: dict[str, set[str]], source: str, *forbidden: str) -> None:
    bad = crossings(graph, source, forbidden)
    what, *where = (f"{f}/" if f in FOLDERS else f for f in (source, *forbidden))
    assert bad == [], f"{what} must not import {', '.join(where)}; it does: " + "; ".join(bad)


def test_layers_never_import_what_stacks_them(graph: dict[str, set[str]]) -> None:
    """layers/ never import serve/, review/ or edge/: a layer knows what is below it
    (backends, fleet/, observe/, revocation/, the foundations), never who stacks it or
    how a review arrives."""
    assert_never_imports(graph, "layers", "serve", "review", "edge")


def test_fleet_imports_no_layer_review_or_server(graph: dict[str, set[str]]) -> None:
    """fleet/ (the Redis link, fleet size, sealing, shared blobs) never imports layers/,
    review/, serve/, edge/ or revocation/: it is the plumbing the layers' and the deny
    list's Redis stores stand on. Which store each layer gets is chosen in
    review/stores.py, beside the stack that uses them."""
    assert_never_imports(graph, "fleet", "layers", "review", "serve", "edge", "revocation")


def test_observe_imports_no_layer_review_or_server(graph: dict[str, set[str]]) -> None:
    """observe/ (the metrics registry, logs, readiness, loop lag, internal errors) imports
    no module of layers/, review/, serve/, edge/, fleet/ or revocation/: everything reports
    to it. Each part declares its own metrics beside it (a ``metrics.py`` in its folder)."""
    assert_never_imports(
        graph, "observe", "layers", "review", "serve", "edge", "fleet", "revocation"
    )


def test_edge_never_imports_the_review_path(graph: dict[str, set[str]]) -> None:
    """edge/ (HTTP connections, TLS, caller auth) never imports review/, layers/, serve/,
    fleet/ or revocation/: it reads and answers HTTP and hands a request to whatever
    application it is given; a refusal's body is kube_status.py's."""
    assert_never_imports(graph, "edge", "review", "layers", "serve", "fleet", "revocation")


def test_review_never_imports_the_server_or_the_edge(graph: dict[str, set[str]]) -> None:
    """review/ never imports serve/ or edge/: serve/ assembles a review path and puts it
    behind the edge, never the other way round."""
    assert_never_imports(graph, "review", "serve", "edge")


def test_authorization_imports_no_review_path_server_or_edge(
    graph: dict[str, set[str]],
) -> None:
    """authorization/ (the SubjectAccessReview webhook: its format, policies, decisions,
    cache) never imports serve/, edge/, review/, layers/, fleet/ or revocation/: a
    decision reads the review alone, never a backend's stack, and serve/ puts it behind
    the edge as it puts the review path."""
    assert_never_imports(
        graph, "authorization", "serve", "edge", "review", "layers", "fleet", "revocation"
    )


def test_revocation_imports_no_layer_review_or_server(graph: dict[str, set[str]]) -> None:
    """revocation/ (deny list, eviction, the bus) never imports layers/, review/, serve/
    or edge/: the cache layer and the admin API use it, it uses neither."""
    assert_never_imports(graph, "revocation", "layers", "review", "serve", "edge")


def test_foundations_import_no_folder(graph: dict[str, set[str]]) -> None:
    """The top-level modules are foundations (config, keyed hashes, the Status body,
    secret strength, tasks: any folder may import them, and they import none) or entry
    points (the CLIs, which may import anything). A new top-level module is one or the
    other."""
    found = {folder(name) for name in graph if name.startswith("authn_gateway.")}
    known = {*FOLDERS, *FOUNDATIONS, *ENTRY_POINTS}
    assert found == known, (
        f"new: {sorted(found - known)}, gone: {sorted(known - found)}: a top-level module "
        "goes in FOUNDATIONS or ENTRY_POINTS, a folder in FOLDERS (with its rule)"
    )
    for foundation in FOUNDATIONS:
        assert_never_imports(graph, foundation, *FOLDERS, *ENTRY_POINTS)


def test_the_folders_depend_one_way(graph: dict[str, set[str]]) -> None:
    """Between the folders (and backends, and the top-level modules) dependencies point
    one way: no cycle when each is seen as one node, but for the :data:`EXCEPTIONS`."""
    cycle = cycle_in(between_folders(graph))
    assert cycle is None, "the folders import each other: " + " -> ".join(cycle or [])


def between_folders(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the folders its modules import, but for the :data:`EXCEPTIONS`."""
    between: dict[str, set[str]] = {}
    for name, deps in graph.items():
        for dep in deps:
            if folder(dep) != folder(name) and (name, dep) not in EXCEPTIONS:
                between.setdefault(folder(name), set()).add(folder(dep))
    return between


def test_a_broken_rule_names_the_import() -> None:
    """The rules above fail naming each offending import (and only those)."""
    graph = {
        "authn_gateway.layers.cache.layer": {
            "authn_gateway.serve.gateway",
            "authn_gateway.fleet.redis_link",
        },
        "authn_gateway.serve.gateway": {"authn_gateway.layers.cache.layer"},
    }
    with pytest.raises(AssertionError) as err:
        assert_never_imports(graph, "layers", "serve", "review")
    assert str(err.value).startswith(
        "layers/ must not import serve/, review/; it does: "
        "authn_gateway.layers.cache.layer -> authn_gateway.serve.gateway"
    ), str(err.value)
    assert cycle_in(between_folders(graph)) == ["layers", "serve", "layers"]


def test_backends_never_import_the_gateway(graph: dict[str, set[str]]) -> None:
    """backends/ never imports authn_gateway: a backend is an identity provider's client,
    usable (and tested) without the gateway around it."""
    bad = sorted(
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if folder(name) == "backends"
        for dep in deps
        if folder(dep) != "backends"
    )
    assert bad == [], "backends/ must not import authn_gateway; it does: " + "; ".join(bad)


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


def imports_of_its_own_package(source: str, name: str) -> list[int]:
    """The lines where module ``name`` imports from its own package (``from P import
    n`` in a module of ``P``, or ``from . import n``): it reads as importing ``P``'s
    ``__init__``, whatever ``n`` is."""
    package = name.rpartition(".")[0]
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and imported_from(node, package) == package:
            lines.append(node.lineno)
    return lines


def test_a_package_and_the_modules_it_imports_import_one_way(graph: dict[str, set[str]]) -> None:
    """A package's ``__init__`` that imports one of its modules is not imported from by
    it: the module names what it needs by its own path (``from backends.jwt.idtoken
    import ...``), so the two import one way only (issue 36: backends/jwt's
    ``__init__`` and ``backend`` imported each other)."""
    paths = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    both_ways = [
        f"{module}:{line}"
        for package, deps in graph.items()
        if paths[package].name == "__init__.py"
        for module in sorted(deps)
        if module.startswith(package + ".")
        for line in imports_of_its_own_package(paths[module].read_text(), module)
    ]
    assert both_ways == [], f"import from the package whose __init__ imports them: {both_ways}"
    assert imports_of_its_own_package("from pkg import a\n", "pkg.b") == [1]
    assert imports_of_its_own_package("from . import a\n", "pkg.b") == [1]
    assert imports_of_its_own_package("from pkg.a import x\n", "pkg.b") == []


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
