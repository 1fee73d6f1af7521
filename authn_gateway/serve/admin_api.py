"""The admin API's identity routes: ``POST /admin/evict`` and ``POST/GET/DELETE /admin/deny``.

Protected by the same token as ``/admin/breakers``. Bodies name one subject,
``{"user": NAME}``, ``{"token_id": ID}`` or ``{"credential_id": "JTI=..."}``, plus
``"seconds"`` for a denial and an optional ``"by"``: the operator's name for the audit
log (given, not verified). Every answer is JSON: what was done, or ``{"message": ...}``
saying what is wrong.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from authn_gateway.json_body import json_object as json_object_of
from authn_gateway.observe.audit import AuditLog
from authn_gateway.revocation.subject import FIELDS, BadSubject, Subject, from_request
from authn_gateway.serve.gateway import Gateway

SUBJECT_FIELDS = frozenset(FIELDS.values())

MAX_BODY = 4096
MAX_OPERATOR = 64


class BadRequest(ValueError):
    """A request the admin API refuses; ``str()`` is the message, naming the field."""

    status = 400


class TooLarge(BadRequest):
    status = 413


def _refuse(status: int, message: str) -> Response:
    return JSONResponse({"message": message}, status_code=status)


def json_object(raw: bytes) -> dict[str, Any]:
    """An admin call's JSON object body, or :class:`BadRequest` saying what is wrong."""
    if len(raw) > MAX_BODY:
        raise BadRequest(f"body larger than {MAX_BODY} bytes")
    return json_object_of(raw, BadRequest)


async def capped_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The body, never read past ``limit`` bytes: a declared Content-Length over it is
    refused before a byte of the body is read, a chunked one once it passes the limit
    (the edge then discards the rest, or closes the connection)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise TooLarge(f"body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"body larger than {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest("the client closed the connection before the body ended") from None
    return b"".join(chunks)


async def _body(request: Request) -> dict[str, Any]:
    return json_object(await capped_body(request))


def operator_name(doc: dict[str, Any]) -> str | None:
    name = doc.get("by")
    if name is None:
        return None
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= MAX_OPERATOR
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
    ):
        raise BadRequest(f"by: must be a name of 1 to {MAX_OPERATOR} printable characters")
    return name


def _subject(doc: dict[str, Any]) -> Subject:
    # "seconds" and "by" ride along; the subject must be exactly one of the subject keys.
    return from_request({k: v for k, v in doc.items() if k in SUBJECT_FIELDS})


def _seconds(doc: dict[str, Any], limit: int) -> int:
    seconds = doc.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 < seconds <= limit:
        raise BadRequest(f"seconds: must be a whole number from 1 to {limit}")
    return seconds


#: The admin token check: None to go on, else the answer (401, 429) to send.
Refusal = Callable[[Request], Response | None]

Handler = Callable[[Request, dict[str, Any], str], Awaitable[tuple[str, Subject | None, Any]]]


def revocation_routes(
    gateway: Gateway, refusal: Refusal, audit_log: AuditLog | None
) -> list[Route]:
    """``refusal``: the admin token check that guards /admin/breakers too."""
    revocations = gateway.revocations
    limit = gateway.config.deny_list.max_seconds

    def endpoint(
        handler: Handler, reads_body: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if (refused := refusal(request)) is not None:
                return refused
            caller = request.client.host if request.client else "unknown"
            try:
                doc = await _body(request) if reads_body else {}
                operator = operator_name(doc)
                by = f"{operator or 'admin'}@{caller}"
                action, subject, answer = await handler(request, doc, by)
            except BadRequest as exc:
                return _refuse(exc.status, str(exc))
            except BadSubject as exc:
                return _refuse(400, str(exc))
            if audit_log is not None and subject is not None:
                audit_log.action(
                    caller=caller,
                    operator=operator,
                    action=action,
                    subject=subject.to_json(),
                    result=answer,
                )
            return JSONResponse(answer)

        return run

    async def evict(_: Request, doc: dict[str, Any], by: str) -> tuple[str, Subject, Any]:
        subject = _subject(doc)
        return "evict", subject, await revocations.evict(subject, by)

    async def deny(_: Request, doc: dict[str, Any], by: str) -> tuple[str, Subject, Any]:
        subject = _subject(doc)
        seconds = _seconds(doc, limit)
        return "deny", subject, await revocations.deny(subject, seconds, by)

    async def lift(_: Request, doc: dict[str, Any], by: str) -> tuple[str, Subject, Any]:
        subject = _subject(doc)
        return "lift", subject, await revocations.lift(subject, by)

    async def listing(_: Request, doc: dict[str, Any], by: str) -> tuple[str, None, Any]:
        return "list", None, revocations.listing(time.time())

    deny_route = endpoint(deny)
    lift_route = endpoint(lift)
    list_route = endpoint(listing, reads_body=False)

    async def deny_any(request: Request) -> Response:
        if request.method == "GET":
            return await list_route(request)
        if request.method == "DELETE":
            return await lift_route(request)
        return await deny_route(request)

    return [
        Route("/admin/evict", endpoint(evict), methods=["POST"]),
        Route("/admin/deny", deny_any, methods=["GET", "POST", "DELETE"]),
    ]
