"""The two reference webhooks the benchmark compares one gateway worker with.

Both parse the TokenReview body and answer a fixed authenticated TokenReview:

* ``starlette``: a bare starlette route, ``await request.json()`` (stdlib json) and a
  ``JSONResponse``: what a plain Python webhook looks like;
* ``raw``: a raw ASGI callable with orjson: the ceiling for Python on this stack.

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


async def raw_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
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


APPS: dict[str, Any] = {"starlette": starlette_app, "raw": raw_app}


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
