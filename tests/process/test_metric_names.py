"""The metric families a gateway exports are the contract of the dashboards, the alert
rules, their promtool tests and docs/operations.md: a real gateway with a backend of
every kind and Redis exports exactly the families (name, type, help text) listed in
tests/support/metric_names.txt, written when metrics moved beside their layers
(issue 31). A rename fails here, naming the line."""

from __future__ import annotations

import difflib
from pathlib import Path

from tests.support.metric_names import FIXTURE, families, scrape, scrape_every_kind


def test_a_gateway_with_every_backend_kind_exports_the_listed_families(tmp_path: Path) -> None:
    exported = families(scrape_every_kind(tmp_path))
    listed = FIXTURE.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(listed, exported, "listed", "exported", lineterm=""))
    assert exported == listed, f"the exported metric families changed:\n{diff}"


def test_a_gateway_without_redis_or_jwt_exports_the_same_families_but_the_jwt_keys(
    tmp_path: Path,
) -> None:
    """Which families exist does not hang on the config: without Redis, a breaker or a
    concurrency limit, their families are there (with no samples, or 0). Only a
    backend's own collector (jwt's key sets) comes with that backend."""
    static = tmp_path / "static.csv"
    static.write_text("static-token,alice,uid-1,\n")
    config = {
        "server": {"ops": {"port": 0}},
        "backends": [{"name": "static", "type": "static", "file": str(static)}],
    }
    exported = families(scrape(config, tmp_path))
    listed = [line for line in FIXTURE.read_text().splitlines() if "_jwks_" not in line]
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
