"""SIGHUP: load the config again and, if it is valid, move to a new generation."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from authn_gateway.config import ConfigError, GatewayConfig, load_config
from authn_gateway.observe.internal_errors import unexpected
from authn_gateway.observe.logsetup import configure_logging
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.generation import Generation
from authn_gateway.serve.metrics import ServeMetrics

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
        if running.tls is not None and bool(new.server.caller_tokens) != bool(
            running.caller_tokens
        ):
            # The handshake asks for a certificate by the tokens at start (run()): a
            # caller with a token only cannot connect until then.
            log.warning(
                "config reload: server.caller_tokens %s; whether a caller may connect "
                "without a client certificate changes on restart only",
                "added" if new.server.caller_tokens else "removed",
            )
        kept = new.server.model_copy(update={f: getattr(running, f) for f in RESTART_ONLY})
        return new.model_copy(update={"server": kept})

    async def reload(self) -> bool:
        """Apply the file, or refuse it. Never raises: a reload that fails for any reason
        is refused, logged in one line (``config reload refused``), counted
        (``authn_gateway_config_reloads_total{result="refused"}``), and the running
        config keeps serving; the next SIGHUP is handled as this one was."""
        where = str(self.source) if self.source else "<embedded default>"
        async with self._lock:
            try:
                # Read and parsed in a worker thread: a 1 MiB file takes a while to
                # parse, and reviews go on meanwhile; the swap below is on the loop.
                new = self._keep_listeners(await asyncio.to_thread(load_config, self.source))
            except Exception as exc:
                return self._refuse(_reasons(where, exc))
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
                await _discard(gateway, generation)
                return self._refuse(_reasons(where, exc))
            old = self.app.swap(generation)
            self.running = new
            self._count("applied")
            configure_logging(new.logging.level, new.logging.format, new.logging.queue_lines)
            log.info("config reloaded from %s", where)
        try:
            await old.drain(new.server.graceful_shutdown_seconds + new.review_deadline_seconds)
            await old.close()
        except Exception as exc:
            # The new config serves; only the old one's tidy-up went wrong.
            log.error("config reload: closing the previous config failed: %s", unexpected(exc))
        return True

    def _refuse(self, reasons: str) -> bool:
        self._count("refused")
        log.error("config reload refused, still serving the previous config: %s", reasons)
        return False

    def _count(self, result: str) -> None:
        serving = self.app.gateway.metrics.group(ServeMetrics)
        serving.config_reloads.labels(result).inc()
        serving.config_last_reload_successful.set(1 if result == "applied" else 0)


async def _discard(gateway: Gateway | None, generation: Generation | None) -> None:
    """Close what a refused reload built, leaving the running gateway's stores alone."""
    try:
        if gateway is not None:
            gateway.abandon()  # the running gateway keeps its stores
        if generation is not None:
            await generation.close()
        elif gateway is not None:
            await gateway.close()
    except Exception as exc:
        log.warning("config reload: closing the refused config failed: %s", unexpected(exc))


def _reasons(where: str, exc: Exception) -> str:
    """Why a reload is refused, on one line, never quoting the file."""
    if isinstance(exc, ConfigError):
        return "; ".join(str(exc).splitlines())
    if isinstance(exc, OSError):
        return f"{where}: {exc.strerror or type(exc).__name__}"
    return f"{where}: {unexpected(exc)}"
