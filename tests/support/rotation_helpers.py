"""Helpers shared by the tiers of test_rotation."""

from __future__ import annotations

from typing import Any

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.redis_server import RedisServer

OLD = "rotation-test-old-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"

NEW = "rotation-test-new-Qw3Er5Ty7Ui9Op1As2Df4Gh6Jk8Lz0XcVbNm"

FAIL_MAX = 3


def config(
    idp: FakeIdP,
    server: RedisServer,
    secret: str,
    previous: list[str] | None = None,
    fresh_seconds: float = 1,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "secret": secret,
        "redis": {"url": server.url, "timeout_seconds": 0.5, "breaker_sync_seconds": 0.1},
        # Fresh for 1 s: the rotation below runs on stale answers, as in a long outage.
        "cache": {"positive_ttl_seconds": fresh_seconds, "max_stale_seconds": 3600},
        "backends": [
            userinfo_backend(idp, breaker={"fail_max": FAIL_MAX, "reset_timeout_seconds": 600})
        ],
    }
    if previous:
        cfg["previous_secrets"] = previous
    return cfg


MINIMAL = """
backends:
  - name: demo
    type: static
    tokens: [{token: t, username: u}]
redis: {url: 'redis://127.0.0.1:1/0'}
"""
