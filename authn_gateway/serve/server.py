"""Running the gateway: listeners, TLS, SIGHUP reloads, graceful shutdown, workers.

One process runs one uvicorn server for the review port and, when ``server.ops`` is
set, a second one for health and metrics, both in the same event loop. uvicorn owns
SIGTERM/SIGINT (graceful drain); the gateway owns SIGHUP (config reload). With
``server.workers > 1`` a small supervisor starts that many such processes sharing
the review port through SO_REUSEPORT (see docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
import uvloop

from authn_gateway.config import ConfigError, GatewayConfig
from authn_gateway.edge import EdgeLimits, GatewayHttpProtocol
from authn_gateway.edge.callerauth import CERT_NAMES_KEY
from authn_gateway.edge.metrics import EdgeMetrics
from authn_gateway.edge.pinned import TESTED_UVICORN_MINORS, untested_uvicorn
from authn_gateway.edge.tls import ServerTLS, TLSError
from authn_gateway.kube_status import render_error
from authn_gateway.observe.internal_errors import internal_error, unexpected
from authn_gateway.observe.logsetup import configure_logging
from authn_gateway.review.pipeline import GATEWAY
from authn_gateway.serve.app import GatewayApp, Receive, Scope, Send
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.reloader import Reloader
from backends.durations import whole_seconds

log = logging.getLogger(__name__)

# Open connections on the ops port (probes and Prometheus need a few): each may hold
# up to ~200 KiB whatever it sends (docs/operations.md), so 64 cost under 13 MiB.
OPS_MAX_CONNECTIONS = 64


class _UvicornConfig(uvicorn.Config):  # type: ignore[misc]
    """Carries the edge's limits (and, through them, the TLS context) to the protocol.

    uvicorn's own ``ssl`` stays unset: the protocol runs the handshake itself, with
    the context current at that moment, so that it can count failures and so that a
    reloaded client CA applies (see :mod:`authn_gateway.edge`).
    """

    def __init__(self, app: Any, *, edge: EdgeLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.edge = edge


def edge_limits(config: GatewayConfig, tls: ServerTLS | None) -> EdgeLimits:
    s = config.server
    return EdgeLimits(
        max_header_bytes=s.max_header_bytes,
        max_headers=s.max_headers,
        max_connections=s.max_connections,
        header_timeout=s.header_timeout_seconds,
        body_timeout=s.body_timeout_seconds,
        send_timeout=s.send_timeout_seconds,
        drain_idle_seconds=s.drain_idle_seconds,
        tls_context=tls.current if tls else None,
    )


class _OpsServer(uvicorn.Server):  # type: ignore[misc]
    """The ops listener: the review server owns the signals and stops this one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ReviewOnly:
    """The review port when an ops port exists: only the webhook paths (and lifespan)."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.app.webhook_paths:
            await _refuse(send, 404, "not found", [])
            return
        await self.app(scope, receive, send)

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        return self.app.answer_at_once(scope, body)


async def _refuse(send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = render_error(status, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": body})


class CallersOnly:
    """The review port with no ops port while callers must authenticate: health, metrics
    and admin answer only authenticated callers, like the review path (which checks
    callers itself). Probes and Prometheus without a caller identity need server.ops."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.app.webhook_paths:
            callers = self.app.review.callers
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if callers.identify(scope.get(CERT_NAMES_KEY, ()), authorization) is None:
                await _refuse(
                    send, 401, "caller not authenticated", [(b"www-authenticate", b"Bearer")]
                )
                return
        await self.app(scope, receive, send)

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        # Only the webhook paths are answered at once, and they check callers themselves.
        return self.app.answer_at_once(scope, body)


class OpsOnly:
    """The ops port: health, metrics and admin of whichever gateway is current."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app.ops(scope, receive, send)


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        # Each worker binds the same port; the kernel spreads connections over them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    where = f"{host or '0.0.0.0'}:{port}"  # noqa: S104 - empty host means all addresses
    try:
        sock.bind((host or "0.0.0.0", port))  # noqa: S104
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


#: What every listener of ours sets: the review port's and the ops port's.
_EVERY_LISTENER: dict[str, Any] = {
    # uvicorn's access log alone halves throughput; the review log replaces it.
    "access_log": False,
    "log_config": None,
    "http": GatewayHttpProtocol,
    # Callers are identified by certificate, token or socket address, never by a header.
    "proxy_headers": False,
    "server_header": False,
    "ws": "none",
}


def _uvicorn_config(app: Any, config: GatewayConfig, edge: EdgeLimits) -> _UvicornConfig:
    s = config.server
    return _UvicornConfig(
        app,
        edge=edge,
        lifespan="on",
        timeout_graceful_shutdown=whole_seconds(s.graceful_shutdown_seconds),
        # kube-apiserver keeps one connection open for all its calls.
        timeout_keep_alive=75,
        **_EVERY_LISTENER,
    )


def _ops_config(app: GatewayApp, edge: EdgeLimits) -> _UvicornConfig:
    return _UvicornConfig(OpsOnly(app), edge=edge, lifespan="off", **_EVERY_LISTENER)


def _warn_if_open(config: GatewayConfig) -> None:
    s = config.server
    if not s.callers_must_authenticate and s.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "no caller authentication (server.tls.client_ca_file or server.caller_tokens): "
            "anyone who reaches %s:%d can use this gateway as a token oracle",
            s.host or "0.0.0.0",  # noqa: S104
            s.port,
        )
    if s.caller_tokens and s.tls is None:
        log.warning("server.caller_tokens over plain HTTP: the tokens cross the network in clear")
    untested = untested_uvicorn()
    if untested is not None:
        log.warning(
            "uvicorn %s is not a release the HTTP edge is tested with (%s): "
            "install the version pyproject.toml pins",
            untested,
            ", ".join(f"{m}.x" for m in TESTED_UVICORN_MINORS),
        )


async def run(config: GatewayConfig, source: Path | None = None, worker: int = 0) -> None:
    """Serve until SIGTERM/SIGINT; reload on SIGHUP."""
    s = config.server
    where = str(source or "<embedded default.yaml>")
    try:
        tls = ServerTLS(s.tls, client_cert_optional=bool(s.caller_tokens)) if s.tls else None
    except TLSError as exc:
        # The line check-config gives for the same files.
        raise ConfigError(where, [f"server.{exc}"]) from None
    edge = edge_limits(config, tls)
    listeners = {"review": edge}
    ops_edge = EdgeLimits(
        max_header_bytes=s.max_header_bytes,
        max_headers=s.max_headers,
        max_connections=OPS_MAX_CONNECTIONS,
        header_timeout=s.header_timeout_seconds,
        body_timeout=s.body_timeout_seconds,
        send_timeout=s.send_timeout_seconds,
        drain_idle_seconds=s.drain_idle_seconds,
    )
    if s.ops is not None:
        listeners["ops"] = ops_edge
    gateway = Gateway(config, source=where)
    gateway.metrics.group(EdgeMetrics).watch(listeners, tls)
    app = GatewayApp(gateway)

    def report_error(exc: BaseException) -> None:
        # Counted in the current gateway's metrics (a reload replaces the gateway).
        internal_error(GATEWAY, exc, app.gateway.metrics)

    edge.report_error = ops_edge.report_error = report_error
    review_sock = _bind(s.host, s.port, reuse_port=s.workers > 1)
    front: Any = app
    if s.ops is not None:
        front = ReviewOnly(app)
    elif s.callers_must_authenticate:
        front = CallersOnly(app)
    # Cache hits are answered by the protocol without a task (edge/protocol.py).
    edge.answer_at_once = front.answer_at_once
    review_server = uvicorn.Server(_uvicorn_config(front, config, edge))
    ops_server: _OpsServer | None = None
    ops_task: asyncio.Task[None] | None = None
    if s.ops is not None:
        ops_port = s.ops.port + worker if s.ops.port else 0
        ops_sock = _bind(s.ops.host or s.host, ops_port, reuse_port=False)
        ops_server = _OpsServer(_ops_config(app, ops_edge))
        ops_task = asyncio.create_task(ops_server.serve(sockets=[ops_sock]))
        log.info("ops listener (health, metrics) on %s:%d", *ops_sock.getsockname()[:2])
    scheme = "https" if tls else "http"
    log.info("listening on %s://%s:%d", scheme, *review_sock.getsockname()[:2])
    _warn_if_open(config)

    loop = asyncio.get_running_loop()
    reloader = Reloader(app, source, config)
    loop.add_signal_handler(signal.SIGHUP, reloader.trigger)
    watcher = asyncio.create_task(tls.watch()) if tls else None
    try:
        await review_server.serve(sockets=[review_sock])
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if watcher is not None:
            watcher.cancel()
        if reloader.tasks:
            await asyncio.wait(reloader.tasks, timeout=s.graceful_shutdown_seconds)
        if ops_server is not None and ops_task is not None:
            ops_server.should_exit = True
            await ops_task


def _run_process(config: GatewayConfig, source: Path | None, worker: int) -> int:
    # uvicorn re-raises the SIGTERM it drained for under the handler it found; a no-op
    # one lets the ops listener and reloads finish too, and the process exit with 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(config, source, worker))
    except (TLSError, OSError, ConfigError) as exc:
        log.error("%s", exc)
        return 1
    except Exception as exc:  # a bug of ours: one line by type and place, no message
        log.error("the gateway stopped: %s", unexpected(exc))
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _worker_main(config: GatewayConfig, source: Path | None, worker: int) -> None:
    configure_logging(config.logging.level, config.logging.format, config.logging.queue_lines)
    sys.exit(_run_process(config, source, worker))


def _supervise(config: GatewayConfig, source: Path | None) -> int:
    """Start ``server.workers`` processes; forward SIGHUP and SIGTERM; restart a worker
    that dies, unless it dies right after starting (then stop: it would only loop)."""
    context = multiprocessing.get_context("spawn")
    stopping = False

    def start(i: int) -> tuple[Any, float]:
        proc = context.Process(
            target=_worker_main, args=(config, source, i), name=f"authn-gateway-worker-{i}"
        )
        proc.start()
        return proc, time.monotonic()

    workers = {i: start(i) for i in range(config.server.workers)}

    def on_stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    def on_hup(signum: int, _frame: Any) -> None:
        for proc, _ in workers.values():
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGHUP)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    log.info("supervising %d workers", len(workers))
    failed = False
    while not stopping:
        time.sleep(0.2)
        for i, (proc, started) in list(workers.items()):
            if proc.is_alive() or stopping:
                continue
            if time.monotonic() - started < 5:
                log.error(
                    "worker %d exited with %s right after starting; stopping", i, proc.exitcode
                )
                stopping = failed = True
                break
            log.error("worker %d exited with %s; starting a new one", i, proc.exitcode)
            workers[i] = start(i)

    for proc, _ in workers.values():
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + config.server.graceful_shutdown_seconds + 5
    for proc, _ in workers.values():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    return 1 if failed else 0


def serve(config: GatewayConfig, source: Path | None = None) -> int:
    """Run the gateway in the foreground; ``source`` is re-read on SIGHUP."""
    if config.server.workers > 1:
        return _supervise(config, source)
    return _run_process(config, source, 0)
