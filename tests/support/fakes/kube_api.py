"""A fake kube-apiserver serving what ``kubectl logs`` reads, over a real socket.

No kube-apiserver can run here, so this follows its documented REST API for the calls
``kubectl logs`` makes: discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/apps/v1``),
a Deployment (``GET .../deployments/NAME``), pods by label selector
(``GET /api/v1/namespaces/NS/pods?labelSelector=...``), one pod, and a container's log
(``GET .../pods/NAME/log?container=C``, plain text, ``tailLines`` honoured). The pods'
logs are whatever the test gives, usually the output of real gateway processes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]


@dataclass
class FakePod:
    name: str
    labels: dict[str, str]
    container: str
    #: The container's log, read when asked (a real process may still be writing it).
    log: Callable[[], str]
    created: str = "2026-01-01T00:00:00Z"


def _resources(group_version: str, resources: list[tuple[str, str, str, list[str]]]) -> Json:
    """An APIResourceList: (name, kind, singular name, short names) of namespaced kinds."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {"name": name, "singularName": singular, "namespaced": True, "kind": kind,
             "verbs": ["get", "list"], "shortNames": short}
            for name, kind, singular, short in resources
        ],
    }  # fmt: skip


class FakeKubeAPI:
    def __init__(self, namespace: str, pods: list[FakePod], deployment: Json | None = None):
        self.namespace = namespace
        self.pods = pods
        self.deployment = deployment
        #: Every request's path and query, in order: what kubectl asked for.
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _pod(self, pod: FakePod) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": self.namespace, "labels": pod.labels,
                         "creationTimestamp": pod.created, "uid": f"uid-{pod.name}"},
            "spec": {"containers": [{"name": pod.container, "image": "authn-gateway"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": pod.container, "ready": True, "restartCount": 0,
                                       "image": "authn-gateway", "imageID": "",
                                       "state": {"running": {"startedAt": pod.created}}}],
            },
        }  # fmt: skip

    def _selected(self, selector: str) -> list[FakePod]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        return [p for p in self.pods if all(p.labels.get(k) == v for k, v in wanted.items())]

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, str]:
        """(status, content type, body) for a GET."""
        ns = f"/api/v1/namespaces/{self.namespace}/pods"
        if path == "/api":
            return 200, "application/json", json.dumps({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            group = {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                     "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}  # fmt: skip
            return (
                200,
                "application/json",
                json.dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}),
            )
        if path == "/api/v1":
            body = _resources("v1", [("pods", "Pod", "pod", ["po"]), ("pods/log", "Pod", "", [])])
            return 200, "application/json", json.dumps(body)
        if path == "/apis/apps/v1":
            body = _resources("apps/v1", [("deployments", "Deployment", "deployment", ["deploy"])])
            return 200, "application/json", json.dumps(body)
        deployments = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/"
        if (
            self.deployment is not None
            and path == deployments + self.deployment["metadata"]["name"]
        ):
            return 200, "application/json", json.dumps(self.deployment)
        if path == ns:
            pods = self._selected(query.get("labelSelector", [""])[0])
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                    "items": [self._pod(p) for p in pods]}  # fmt: skip
            return 200, "application/json", json.dumps(body)
        for pod in self.pods:
            if path == f"{ns}/{pod.name}":
                return 200, "application/json", json.dumps(self._pod(pod))
            if path == f"{ns}/{pod.name}/log":
                lines = pod.log().splitlines(keepends=True)
                tail = int(query.get("tailLines", ["-1"])[0])
                if tail >= 0:
                    lines = lines[len(lines) - tail :] if tail else []
                return 200, "text/plain", "".join(lines)
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                  "reason": "NotFound", "code": 404, "message": f"{path} not found"}  # fmt: skip
        return 404, "application/json", json.dumps(status)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                api.requests.append(self.path)
                status, ctype, body = api.answer(url.path, parse_qs(url.query))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
