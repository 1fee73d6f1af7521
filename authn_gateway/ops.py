"""The ops surface: /healthz, /readyz, /metrics and (when enabled) /admin/breakers,
/admin/evict and /admin/deny (:mod:`.revocation_api`)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .audit import AuditLog
from .breaker.machine import Override
from .gateway import Gateway
from .revocation_api import revocation_routes


def ops_app(gateway: Gateway, audit_log: AuditLog | None = None) -> Starlette:
    """/healthz, /readyz, /metrics and (when enabled) /admin/..."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if not gateway.ready:
            return PlainTextResponse("not ready", status_code=503)
        if not await gateway.readiness.ready():
            # A cold pod during an IdP outage: see authn_gateway/readiness.py.
            waiting = ", ".join(gateway.readiness.waiting_for())
            return PlainTextResponse(f"not ready: no answer yet from {waiting}", status_code=503)
        return PlainTextResponse("ready")

    async def metrics(_: Request) -> Response:
        gateway.metrics.cache_entries.set(len(gateway.stores.cache_store()))
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]
    if gateway.config.admin.enabled:
        routes += admin_routes(gateway)
        routes += revocation_routes(gateway, admin_check(gateway), audit_log)
    return Starlette(routes=routes)


def admin_check(gateway: Gateway) -> Callable[[Request], bool]:
    """Whether a request carries the admin token (compared in constant time)."""
    token = gateway.config.admin.token
    assert token is not None
    expected = f"Bearer {token.get_secret_value()}".encode()

    def allowed(request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    return allowed


def admin_routes(gateway: Gateway) -> list[Route]:
    allowed = admin_check(gateway)

    async def list_breakers(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"message": "unauthorized"}, status_code=401)
        return JSONResponse(
            {
                name: stack.breaker.state
                for name, stack in gateway.pipeline.backends.items()
                if stack.breaker is not None
            }
        )

    async def set_breaker(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"message": "unauthorized"}, status_code=401)
        name = request.path_params["backend"]
        stack = gateway.pipeline.backends.get(name)
        breaker = stack.breaker if stack is not None else None
        if breaker is None:
            return JSONResponse({"message": "no such backend"}, status_code=404)
        action = request.path_params["action"]
        overrides = {
            "force-open": Override.FORCED_OPEN,
            "force-closed": Override.FORCED_CLOSED,
            "release": Override.NONE,
        }
        if action not in overrides:
            return JSONResponse(
                {"message": "action must be force-open, force-closed or release"}, status_code=400
            )
        breaker.force(overrides[action])
        return JSONResponse({name: breaker.state})

    return [
        Route("/admin/breakers", list_breakers),
        Route("/admin/breakers/{backend}/{action}", set_breaker, methods=["POST"]),
    ]
