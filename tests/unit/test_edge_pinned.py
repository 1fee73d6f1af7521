"""The edge subclasses uvicorn's private HttpToolsProtocol: it runs only on the uvicorn
releases it is tested with (authn_gateway/edge/pinned.py), and pyproject pins them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from authn_gateway.edge.pinned import TESTED_UVICORN_MINORS, untested_uvicorn, uvicorn_minor

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_uvicorn_is_one_the_edge_is_tested_with() -> None:
    untested = untested_uvicorn()
    assert untested is None, (
        f"uvicorn {untested} is installed; the edge (GatewayHttpProtocol) is tested with "
        f"{TESTED_UVICORN_MINORS} only. Run the edge tests on it, then add its minor "
        "version to authn_gateway/edge/pinned.py and widen the pin in pyproject.toml."
    )


def test_an_untested_minor_version_is_reported() -> None:
    assert untested_uvicorn("0.56.0") == "0.56.0"
    assert untested_uvicorn("1.0.0") == "1.0.0"
    assert untested_uvicorn(f"{TESTED_UVICORN_MINORS[0]}.7") is None
    assert uvicorn_minor("0.55.0.post1") == "0.55"


def test_pyproject_pins_uvicorn_to_the_tested_minor_versions() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = [Requirement(r) for r in project["dependencies"] if r.startswith("uvicorn")]
    assert len(pins) == 1, pins
    spec = pins[0].specifier
    for minor in TESTED_UVICORN_MINORS:
        assert spec.contains(f"{minor}.0"), (str(spec), minor)
    major, last = TESTED_UVICORN_MINORS[-1].split(".")
    first_major, first = TESTED_UVICORN_MINORS[0].split(".")
    assert not spec.contains(f"{major}.{int(last) + 1}.0"), str(spec)
    assert not spec.contains(f"{first_major}.{int(first) - 1}.0"), str(spec)
