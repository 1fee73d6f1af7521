"""SIGHUP: load the config again and, if it is valid, move to a new generation."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from authn_gateway.config import ConfigError, GatewayConfig, load_config
from authn_gateway.observe.logsetup import configure_logging
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.generation import Generation

log = logging.getLogger(__name__)

# These shape listeners and sockets; a reload keeps the running values.
RESTART_ONLY = (
    "host",
    "port",
    "tls",
    "ops",
    "workers",
    "max_header_bytes",
    "max_headers",
    "max_connections",
    "header_timeout_seconds",
    "body_timeout_seconds",
    "drain_idle_seconds",
    "graceful_shutdown_seconds",
)


class Reloader:
    """SIGHUP: load the file again; if it is valid, start a new gateway, swap it in, and
    close the old one once its in-flight reviews are done. If not, keep serving."""

    def __init__(self, app: GatewayApp, source: Path | None, running: GatewayConfig) -> None:
        self.app = app
        self.source = source
        self.running = running
        self._lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[bool]] = set()

    def trigger(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _keep_listeners(self, new: GatewayConfig) -> GatewayConfig:
        running = self.running.server
        changed = [f for f in RESTART_ONLY if getattr(new.server, f) != getattr(running, f)]
        if changed:
            log.warning(
                "config reload: server.%s changed; that takes effect on restart only",
                ", server.".join(changed),
            )
        kept = new.server.model_copy(update={f: getattr(running, f) for f in RESTART_ONLY})
        return new.model_copy(update={"server": kept})

    async def reload(self) -> bool:
        where = str(self.source) if self.source else "<embedded default>"
        async with self._lock:
            try:
                new = self._keep_listeners(load_config(self.source))
            except ConfigError as exc:
                problems = "; ".join(str(exc).splitlines())
                log.error("config reload refused, still serving the previous config: %s", problems)
                return False
            gateway: Gateway | None = None
            generation: Generation | None = None
            try:
                # The process's metrics carry on: counters survive reloads.
                gateway = Gateway(
                    new, metrics=self.app.gateway.metrics, source=where, previous=self.app.gateway
                )
                generation = Generation(gateway)
                await generation.start()
            except Exception as exc:
                log.error(
                    "config reload refused, still serving the previous config: %s: %s",
                    where,
                    exc,
                )
                if gateway is not None:
                    gateway.abandon()  # the running gateway keeps its stores
                if generation is not None:
                    await generation.close()
                elif gateway is not None:
                    await gateway.close()
                return False
            old = self.app.swap(generation)
            self.running = new
            configure_logging(new.logging.level, new.logging.format, new.logging.queue_lines)
            log.info("config reloaded from %s", where)
        await old.drain(new.server.graceful_shutdown_seconds + new.review_deadline_seconds)
        await old.close()
        return True
