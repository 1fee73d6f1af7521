"""Start and stop real server processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

V1 = "authentication.k8s.io/v1"
V1BETA1 = "authentication.k8s.io/v1beta1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(
    port: int,
    timeout: float = 15.0,
    proc: subprocess.Popen[Any] | None = None,
    host: str = "127.0.0.1",
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def review_body(
    token: str, api_version: str = V1, audiences: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    return {"apiVersion": api_version, "kind": "TokenReview", "spec": spec}


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    config_path: Path
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def review(
        self,
        token: str,
        api_version: str = V1,
        audiences: list[str] | None = None,
        client: httpx.Client | None = None,
        timeout: float = 10.0,
    ) -> httpx.Response:
        body = review_body(token, api_version, audiences)
        if client is not None:
            return client.post(f"{self.url}/authenticate?timeout=30s", json=body)
        return httpx.post(f"{self.url}/authenticate?timeout=30s", json=body, timeout=timeout)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> str:
        """The logs once they contain ``text``: a writer thread writes them, a little
        after the answer that caused a line (logging never blocks a review)."""
        deadline = time.monotonic() + timeout
        while True:
            logs = self.logs()
            if text in logs or time.monotonic() > deadline:
                return logs
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_gateway(
    config: dict[str, Any],
    workdir: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    name: str = "gateway",
    command: tuple[str, ...] = ("authn_gateway", "serve"),
    cwd: Path | None = None,
) -> GatewayProcess:
    """Run ``python -m <command> --config FILE`` (by default ``authn-gateway serve``) with
    ``config`` (a dict, written as YAML) on a free port; in ``cwd`` if given (where a
    relative file name in the config lands), else in this process's."""
    port = port or free_port()
    config = dict(config)
    config.setdefault("server", {})
    config["server"] = {**config["server"], "host": "127.0.0.1", "port": port}
    config_path = workdir / f"{name}-{port}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / f"{name}-{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", *command, "--config", str(config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    gw = GatewayProcess(proc, port, config_path, log_path)
    try:
        wait_for_port(port, proc=proc)
    except Exception:
        gw.stop()
        raise RuntimeError(f"{name} did not start:\n{gw.logs()}") from None
    return gw


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
