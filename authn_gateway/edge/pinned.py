"""The uvicorn releases the edge is tested with.

``GatewayHttpProtocol`` subclasses uvicorn's ``HttpToolsProtocol`` and relies on its
internals (the parser callbacks, the cycle, the flow control, the timeout handlers),
which uvicorn is free to change in any release. pyproject.toml pins the same minor
versions; ``tests/process/test_edge.py`` fails on any other, and the server logs a warning if it
runs on one (an install that ignored the pin).
"""

from __future__ import annotations

from importlib.metadata import version

#: Minor versions ("0.55") every edge test has passed on. Add one only with a full run.
TESTED_UVICORN_MINORS = ("0.55",)


def uvicorn_minor(installed: str | None = None) -> str:
    """The installed uvicorn's ``major.minor``."""
    major, minor, *_ = (installed or version("uvicorn")).split(".")
    return f"{major}.{minor}"


def untested_uvicorn(installed: str | None = None) -> str | None:
    """The installed uvicorn's version when it is not one the edge is tested with."""
    full = installed or version("uvicorn")
    return None if uvicorn_minor(full) in TESTED_UVICORN_MINORS else full
