"""Helpers shared by the tiers of test_routing_answer_now."""

from __future__ import annotations

from typing import Any

from authn_gateway.eager import Suspended, run_eagerly
from authn_gateway.serve.gateway import Gateway
from backends.base import Verdict
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP


def chain_config(first: FakeIdP, second: FakeIdP, **extra: Any) -> dict[str, Any]:
    return {
        "backends": [
            userinfo_backend(first, name="first"),
            userinfo_backend(second, name="second"),
        ],
        **extra,
    }


async def answer(
    gateway: Gateway, token: str, audiences: tuple[str, ...] = ()
) -> tuple[Verdict, bool]:
    """The review's verdict, and whether it was answered at once: run eagerly, as the
    edge runs it (authn_gateway/eager.py), and carried on if it had to wait."""
    run = run_eagerly(gateway.pipeline.review(token, audiences, "c"))
    if isinstance(run, Suspended):
        return await run.resume(), False
    return run, True
