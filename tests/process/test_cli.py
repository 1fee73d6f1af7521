"""The command line: serve on the embedded default, review, --version, --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from authn_gateway import __version__
from tests.support.procs import free_port, wait_for_port


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "authn_gateway", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"authn-gateway {__version__}"


def test_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("serve", "check-config", "review"):
        assert command in result.stdout


def test_review_reads_token_from_stdin_and_prints_the_answer() -> None:
    result = run_cli("review", stdin="demo-dev-token\n")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["apiVersion"] == "authentication.k8s.io/v1"
    assert doc["status"]["user"]["username"] == "demo-dev"
    assert "authenticated by demo" in result.stderr
    assert "demo-dev-token" not in result.stdout + result.stderr


def test_review_explains_a_rejection_in_v1beta1() -> None:
    result = run_cli("review", "--api-version", "v1beta1", "wrong-token")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc == {
        "apiVersion": "authentication.k8s.io/v1beta1",
        "kind": "TokenReview",
        "status": {"authenticated": False},
    }
    assert "rejected by demo" in result.stderr


CLUSTERS = """
server:
  caller_tokens: [{name: ci, token: "ci-caller-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"}]
clusters: [{name: ci, caller_tokens: [ci], backends: [demo]}]
backends:
  - {name: demo, type: static, tokens: [{token: demo-token, username: dev}]}
  - {name: bots, type: static, prefix: "bot-", tokens: [{token: bot-1, username: bot}]}
"""


def test_review_names_the_cluster_and_reviews_as_it(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(CLUSTERS)
    allowed = run_cli("review", "--config", str(config), "--cluster", "ci", stdin="demo-token\n")
    assert allowed.returncode == 0, allowed.stderr
    assert "cluster ci: authenticated by demo" in allowed.stderr
    # ci may not use bots: refused without asking it, and said so; default may.
    refused = run_cli("review", "--config", str(config), "--cluster", "ci", stdin="bot-1\n")
    assert json.loads(refused.stdout)["status"] == {"authenticated": False}
    assert "cluster 'ci' may not use backend 'bots'" in refused.stderr
    other = run_cli("review", "--config", str(config), stdin="bot-1\n")
    assert "cluster default: authenticated by bots" in other.stderr


def test_review_refuses_a_cluster_the_config_does_not_name(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(CLUSTERS)
    result = run_cli("review", "--config", str(config), "--cluster", "prod", stdin="x\n")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "--cluster: no cluster is named 'prod' (the config has: default, ci)"
    )
    assert "Traceback" not in result.stderr


def test_review_reports_an_unreachable_backend(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(f"""
backends:
  - name: sso
    type: userinfo
    url: http://127.0.0.1:{free_port()}/userinfo
    timeouts: {{connect_seconds: 0.5, total_seconds: 1}}
""")
    result = run_cli("review", "--config", str(config), stdin="some-token\n")
    assert result.returncode == 0
    assert json.loads(result.stdout)["status"]["error"] == "sso: connection failed"


def test_review_without_a_token_fails_clearly() -> None:
    result = run_cli("review", stdin="")
    assert result.returncode == 2
    assert "no token given" in result.stderr


def test_serve_runs_the_embedded_default_with_demo_tokens() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "authn_gateway", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc=proc)
        r = httpx.post(
            f"http://127.0.0.1:{port}/authenticate",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": "demo-admin-token"},
            },
        )
        assert r.json()["status"]["user"] == {
            "username": "demo-admin",
            "uid": "1000",
            "groups": ["system:masters"],
            "extra": {"authn-gateway.io/backend": ["demo"]},  # the deciding backend's marker
        }
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=15)
    # uvicorn re-raises the SIGTERM after a clean shutdown, so the exit status is -15.
    assert proc.returncode in (0, -15)
    assert b"Application shutdown complete" in output


def test_admin_defaults_to_the_ops_port_deploy_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.parse import urlsplit

    from authn_gateway import admin_cli
    from authn_gateway.cli import _parser
    from tests.support.kustomize import config_of, render

    monkeypatch.delenv(admin_cli.URL_ENV, raising=False)
    args = _parser().parse_args(["admin", "denied"])
    assert args.url == "http://127.0.0.1:9090"
    # The port kubectl port-forward reaches in the documented deployment: the ops port.
    for overlay in ("base", "overlays/redis", "overlays/redis-sentinel"):
        assert urlsplit(args.url).port == config_of(render(overlay))["server"]["ops"]["port"]
    # A gateway without server.ops serves the admin API on its review port: say so.
    monkeypatch.setenv(admin_cli.URL_ENV, "http://127.0.0.1:8080")
    assert _parser().parse_args(["admin", "denied"]).url == "http://127.0.0.1:8080"
    assert (
        _parser().parse_args(["admin", "--url", "http://10.0.0.5:9091", "denied"]).url
        == "http://10.0.0.5:9091"
    )
    help_text = run_cli("admin", "--help").stdout
    assert "server.ops" in help_text and "9090" in help_text
