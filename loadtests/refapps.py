"""The reference webhooks the benchmarks compare one gateway worker with.

Two parse the TokenReview body and answer a fixed authenticated TokenReview:

* ``starlette``: a bare starlette route, ``await request.json()`` (stdlib json) and a
  ``JSONResponse``: what a plain Python webhook looks like;
* ``raw``: a raw ASGI callable with orjson: the ceiling for Python on this stack.

And one for the SubjectAccessReview endpoint (:mod:`loadtests.authorization`):

* ``raw-sar``: the raw ASGI callable again, reading a SubjectAccessReview (a JSON
  object of that kind with a ``spec`` object) and answering a fixed ``allowed: true``:
  what deciding costs with no policy at all.

They run under uvicorn with the gateway's own server settings (httptools, uvloop, no
access log), so the comparison is between application code only.

    python -m loadtests.refapps starlette --port 8081
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

USER = {"username": "bench-user", "uid": "1000", "groups": ["developers", "viewers"]}


def fixed_review(api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "TokenReview",
        "status": {"authenticated": True, "user": USER},
    }


async def _review(request: Request) -> Response:
    doc = await request.json()
    if not isinstance(doc, dict) or not (doc.get("spec") or {}).get("token"):
        return JSONResponse({"message": "spec.token is required"}, status_code=400)
    return JSONResponse(fixed_review(doc.get("apiVersion", "authentication.k8s.io/v1")))


starlette_app = Starlette(routes=[Route("/authenticate", _review, methods=["POST"])])


async def _body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def raw_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = await _body(receive)
    try:
        doc = orjson.loads(body)
        ok = isinstance(doc, dict) and bool((doc.get("spec") or {}).get("token"))
    except orjson.JSONDecodeError:
        ok = False
    if ok:
        status = 200
        out = orjson.dumps(fixed_review(doc.get("apiVersion", "authentication.k8s.io/v1")))
    else:
        status, out = 400, b'{"message":"spec.token is required"}'
    await _send(send, status, out)


async def raw_sar_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = await _body(receive)
    try:
        doc = orjson.loads(body)
        ok = (
            isinstance(doc, dict)
            and doc.get("kind") == "SubjectAccessReview"
            and isinstance(doc.get("spec"), dict)
        )
    except orjson.JSONDecodeError:
        ok = False
    if ok:
        status = 200
        out = orjson.dumps(
            {"apiVersion": doc.get("apiVersion"), "kind": "SubjectAccessReview",
             "status": {"allowed": True}}
        )  # fmt: skip
    else:
        status, out = 400, b'{"message":"not a SubjectAccessReview"}'
    await _send(send, status, out)


async def _send(send: Send, status: int, out: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(out)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": out})


APPS: dict[str, Any] = {"starlette": starlette_app, "raw": raw_app, "raw-sar": raw_sar_app}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app", choices=sorted(APPS))
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        APPS[args.app],
        host="127.0.0.1",
        port=args.port,
        access_log=False,
        log_level="warning",
        http="httptools",
        loop="uvloop",
        lifespan="off",
        timeout_keep_alive=75,
        server_header=False,
    )


if __name__ == "__main__":
    main()
