"""The ops surface: /healthz, /readyz, /metrics and (when enabled) /admin/breakers,
/admin/evict and /admin/deny (:mod:`.revocation_api`)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from authn_gateway.fleet.redis_link import REPLICA_ID
from authn_gateway.kube_status import render_error
from authn_gateway.layers.breaker.gate import CallGate, replica_view
from authn_gateway.layers.breaker.metrics import BreakerMetrics
from authn_gateway.layers.breaker.override import Override
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.observe.audit import AuditLog
from authn_gateway.serve.admin_api import (
    BadRequest,
    Refusal,
    capped_body,
    json_object,
    operator_name,
    revocation_routes,
)
from authn_gateway.serve.admin_auth import AdminGuard
from authn_gateway.serve.gateway import Gateway


def ops_app(gateway: Gateway, audit_log: AuditLog | None = None) -> Starlette:
    """/healthz, /readyz, /metrics and (when enabled) /admin/..."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if not gateway.ready:
            return PlainTextResponse("not ready", status_code=503)
        if not await gateway.readiness.ready():
            # A cold pod during an IdP outage: see authn_gateway/observe/readiness.py.
            waiting = ", ".join(gateway.readiness.waiting_for())
            return PlainTextResponse(f"not ready: no answer yet from {waiting}", status_code=503)
        return PlainTextResponse("ready")

    async def metrics(_: Request) -> Response:
        gateway.metrics.group(CacheMetrics).entries.set(len(gateway.stores.cache_store()))
        breakers = gateway.metrics.group(BreakerMetrics)
        for name, stack in gateway.pipeline.backends.items():
            if stack.breaker is not None:
                # At scrape time: an override ends by expiring, with no event to count.
                breakers.set_state(name, stack.breaker.state)
                breakers.set_override(name, stack.breaker.forced())
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]
    if gateway.config.admin.enabled:
        token = gateway.config.admin.token
        assert token is not None  # the config requires it when enabled
        guard = AdminGuard(token, gateway.metrics)
        routes += admin_routes(gateway, guard.refusal, audit_log)
        routes += revocation_routes(gateway, guard.refusal, audit_log)
    # An exception of ours is answered 503 (starlette would answer 500), then goes on to
    # the edge, which logs and counts it without a traceback (edge/cycle.py).
    return Starlette(routes=routes, exception_handlers={Exception: _internal_error})


async def _internal_error(_: Request, exc: Exception) -> Response:
    return Response(
        render_error(503, "internal error (logged by the gateway)"),
        status_code=503,
        media_type="application/json",
    )


def admin_routes(
    gateway: Gateway, refusal: Refusal, audit_log: AuditLog | None = None
) -> list[Route]:
    """``refusal``: the admin token check (:class:`.admin_auth.AdminGuard`)."""
    overrides = gateway.stores.overrides()
    settings = gateway.config.admin
    stored_in = "redis" if gateway.config.redis is not None else "memory"

    def gates() -> dict[str, CallGate]:
        return {
            name: stack.breaker
            for name, stack in gateway.pipeline.backends.items()
            if stack.breaker is not None
        }

    async def list_breakers(request: Request) -> Response:
        if (refused := refusal(request)) is not None:
            return refused
        mine = gates()
        now = time.time()
        backends = {}
        for name, gate in mine.items():
            forced = await overrides.read(name)
            backends[name] = {
                "state": gate.state,
                "machine_state": gate.machine_state,
                "override": forced.to_json(now) if forced is not None else None,
            }
        answer: dict[str, Any] = {"replica": REPLICA_ID, "stored_in": stored_in}
        views = await gateway.stores.breaker_views(mine)
        if views is None:
            views = [replica_view(REPLICA_ID, mine, shared=False)]
            answer["message"] = "Redis unreachable: this replica's view only"
        answer.update(backends=backends, replicas=views)
        return JSONResponse(answer)

    async def set_breaker(request: Request) -> Response:
        if (refused := refusal(request)) is not None:
            return refused
        name = request.path_params["backend"]
        gate = gates().get(name)
        if gate is None:
            return _refuse(404, "no such backend (or it has no breaker)")
        action = request.path_params["action"]
        if action not in ACTIONS:
            return _refuse(400, "action must be force-open, force-closed or release")
        try:
            seconds, operator = _override_request(
                await capped_body(request),
                action,
                settings.override_default_seconds,
                settings.override_max_seconds,
            )
        except BadRequest as exc:
            return _refuse(exc.status, str(exc))
        caller = request.client.host if request.client else "unknown"
        previous = gate.state
        shared = await overrides.put(
            name, ACTIONS[action], seconds, f"{operator or 'admin'}@{caller}"
        )
        if gate.state != previous:
            gateway.metrics.group(BreakerMetrics).transition(name, previous, gate.state)
        forced = gate.forced()
        answer: dict[str, Any] = {
            "backend": name,
            "action": action,
            "state": gate.state,
            "machine_state": gate.machine_state,
            "override": forced.to_json() if forced is not None else None,
            "stored_in": "redis" if shared else "memory",
        }
        if stored_in == "redis" and not shared:
            answer["message"] = (
                "Redis unreachable: in force on this replica only; written for the fleet "
                "when Redis answers"
            )
        if audit_log is not None:
            audit_log.action(
                caller=caller,
                operator=operator,
                action=f"breaker {action}",
                subject={"backend": name},
                result=answer,
            )
        return JSONResponse(answer)

    return [
        Route("/admin/breakers", list_breakers),
        Route("/admin/breakers/{backend}/{action}", set_breaker, methods=["POST"]),
    ]


ACTIONS = {
    "force-open": Override.FORCED_OPEN,
    "force-closed": Override.FORCED_CLOSED,
    "release": Override.NONE,
}


def _override_request(raw: bytes, action: str, default: int, limit: int) -> tuple[int, str | None]:
    """(seconds, operator) from an optional JSON body ``{"seconds": N, "by": NAME}``."""
    doc = json_object(raw) if raw.strip() else {}
    unknown = sorted(set(doc) - {"seconds", "by"})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: the body takes seconds and by")
    operator = operator_name(doc)
    if "seconds" not in doc:
        return default, operator
    if action == "release":
        raise BadRequest("seconds: a release takes no seconds")
    seconds = doc["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 < seconds <= limit:
        raise BadRequest(
            f"seconds: must be a whole number from 1 to {limit} (admin.override_max_seconds)"
        )
    return seconds, operator


def _refuse(status: int, message: str) -> Response:
    return JSONResponse({"message": message}, status_code=status)
