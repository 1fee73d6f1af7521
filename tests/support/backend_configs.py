"""Backend configs the tests point at their fake IdPs."""

from __future__ import annotations

from tests.support.fakes.idp import FakeIdP


def userinfo_backend(idp: FakeIdP, **overrides: object) -> dict[str, object]:
    """A userinfo backend pointed at the fake IdP, with test-friendly resilience knobs."""
    backend: dict[str, object] = {
        "name": "idp",
        "type": "userinfo",
        "url": idp.url,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
        "breaker": {"fail_max": 3, "reset_timeout_seconds": 2.0, "half_open_probes": 1},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    backend.update(overrides)
    return backend
