"""docs/architecture.md's map matches the tree: every module it names exists, and every
folder it opens lists all of its modules and packages, so a new module cannot hide."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def map_entries(text: str) -> list[str]:
    """The paths of the ```text block under '## Map', from their indentation."""
    section = text.split("## Map", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block is not None, "docs/architecture.md: no ```text block under '## Map'"
    paths: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        name = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(p for _, p in stack) + name
        paths.append(path)
        if name.endswith("/"):
            stack.append((indent, name))
    return paths


def children(folder: Path) -> set[str]:
    found = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    found |= {f"{d.name}/" for d in folder.iterdir() if (d / "__init__.py").exists()}
    return found


def test_every_module_the_map_names_exists() -> None:
    missing = [p for p in map_entries(DOC.read_text()) if not (REPO / p).exists()]
    assert missing == [], f"docs/architecture.md's map names what is not in the tree: {missing}"


def test_every_folder_the_map_opens_lists_all_it_holds() -> None:
    entries = map_entries(DOC.read_text())
    listed: dict[str, set[str]] = {}
    for path in entries:
        parent, _, name = path.rstrip("/").rpartition("/")
        if parent:
            listed.setdefault(parent + "/", set()).add(name + ("/" if path.endswith("/") else ""))
    assert {"authn_gateway/", "backends/"} <= set(listed)
    for folder, names in listed.items():
        actual = children(REPO / folder)
        assert names == actual, (
            f"docs/architecture.md's map of {folder}: missing {sorted(actual - names)}, "
            f"gone {sorted(names - actual)}"
        )


def test_the_map_reader_follows_indentation() -> None:
    text = "## Map\n```text\na/\n  b.py   x\n  c/     y\n    d.py z\ne.py\n```\n"
    assert map_entries(text) == ["a/", "a/b.py", "a/c/", "a/c/d.py", "e.py"]
