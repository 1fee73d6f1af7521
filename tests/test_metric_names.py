"""The metric families a gateway exports are the contract of the dashboards, the alert
rules, their promtool tests and docs/operations.md: a real gateway with a backend of
every kind and Redis exports exactly the families (name, type, help text) listed in
tests/support/metric_names.txt, written when metrics moved beside their layers
(issue 31). A rename fails here, naming the line."""

from __future__ import annotations

import difflib
from pathlib import Path

from tests.support.metric_names import FIXTURE, families, scrape_every_kind


def test_a_gateway_with_every_backend_kind_exports_the_listed_families(tmp_path: Path) -> None:
    exported = families(scrape_every_kind(tmp_path))
    listed = FIXTURE.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(listed, exported, "listed", "exported", lineterm=""))
    assert exported == listed, f"the exported metric families changed:\n{diff}"


def test_families_reads_help_and_type_and_leaves_out_creation_times() -> None:
    scrape = (
        "# HELP a_total Things.\n# TYPE a_total counter\na_total 1.0\n"
        "# HELP a_created Things.\n# TYPE a_created gauge\na_created 1.7e9\n"
        "# HELP b_seconds Time, with spaces.\n# TYPE b_seconds histogram\n"
        "# HELP lone_created Not a creation time.\n# TYPE lone_created gauge\n"
    )
    assert families(scrape) == [
        "a_total counter Things.",
        "b_seconds histogram Time, with spaces.",
        "lone_created gauge Not a creation time.",
    ]
