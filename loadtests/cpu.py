"""CPU time used by processes, from Linux /proc: what a benchmark's parts cost."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used (Linux /proc), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a server's workers)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += cpu_seconds(p) or 0.0
        todo += _children(p)
    return total
