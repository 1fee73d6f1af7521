"""One config generation: its gateway, review endpoint, ops app and logs.

The reloader starts a new generation, swaps it in, then drains and closes the old one;
the process's metrics registry is shared by all of them, so counters survive reloads.
"""

from __future__ import annotations

import asyncio

from authn_gateway.observe.reviewlog import ReviewLog
from authn_gateway.serve.authorize import AuthorizeEndpoint
from authn_gateway.serve.endpoint import ReviewEndpoint
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.ops import ops_app


class Generation:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        config = gateway.config
        logs = config.logging
        self.review_log = (
            ReviewLog(
                logs.format,
                queue_lines=logs.queue_lines,
                summary_seconds=logs.outage_summary_seconds,
            )
            if logs.reviews
            else None
        )
        self.review_path = config.server.review_path
        self.review = ReviewEndpoint(gateway, self.review_log)
        self.authorize_path: str | None = None
        self.authorize: AuthorizeEndpoint | None = None
        if gateway.authorization is not None and config.authorization is not None:
            self.authorize_path = config.authorization.path
            self.authorize = AuthorizeEndpoint(
                gateway.authorization,
                config.server,
                self.review.callers,
                gateway.metrics,
                gateway.clusters,
            )
        self.ops = ops_app(gateway, self.review.audit_log)

    async def start(self) -> None:
        await self.gateway.start()

    async def drain(self, patience: float) -> None:
        """Wait, at most ``patience`` seconds, for the reviews it is running to finish."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while self.review.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.gateway.close()
        self.review.close_logs()
