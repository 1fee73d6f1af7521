"""The runbook's commands, run where they can be: against real gateway processes' logs.

"Revoking access during an IdP outage" finds a user in the logs of a three-replica
deployment. Three real gateways (JSON logs, audit log on stdout, as deploy/ runs them)
serve as the three pods of a fake kube-apiserver (tests/support/fakes/kube_api.py,
following kube's REST API for the calls ``kubectl logs`` makes); the runbook's own
command line, taken from docs/operations.md, runs through bash with the real
``kubectl`` and ``grep``. A user denied through the real ``authn-gateway admin`` CLI is
named in the review line, the audit line and the admin log line.

AuthnGatewayClusterDominatesIdP's log search counts one cluster's answers, users and
kube-apiservers across two replicas that serve two clusters by caller token.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.fakes.kube_api import FakeKubeAPI, FakePod
from tests.support.kustomize import ROOT, find, render
from tests.support.procs import GatewayProcess, free_port, start_gateway

OPERATIONS = ROOT / "docs" / "operations.md"

NAMESPACE = "authn-gateway"

ADMIN_TOKEN = base64.b64encode(os.urandom(32)).decode()

MALLORY = "mallory-" + base64.urlsafe_b64encode(os.urandom(18)).decode()

ALICE = "alice-" + base64.urlsafe_b64encode(os.urandom(18)).decode()


def runbook_block(heading: str) -> str:
    """The first shell block under ``heading`` in docs/operations.md."""
    text = OPERATIONS.read_text()
    section = text[text.index(f"## {heading}") :]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def find_identity_command() -> str:
    """Step 1 of the revocation runbook: its kubectl ... | grep line, continuations joined."""
    block = runbook_block("Revoking access during an IdP outage")
    step = block[block.index("# 1.") : block.index("# 2.")]
    lines = [line for line in step.splitlines() if not line.lstrip().startswith("#")]
    command = "\n".join(lines).replace("\\\n", " ").strip()
    assert command.startswith("kubectl ") and "mallory" in command, command
    return command


def gateway_config() -> dict[str, Any]:
    return {
        "server": {"ops": {"port": free_port()}, "audit_log": "-"},
        "logging": {"format": "json", "level": "info"},
        "admin": {"enabled": True, "token": ADMIN_TOKEN},
        "backends": [
            {"name": "corp", "type": "static", "tokens": [
                {"token": MALLORY, "username": "mallory", "groups": ["dev"]},
                {"token": ALICE, "username": "alice", "groups": ["dev"]},
            ]},
        ],
    }  # fmt: skip


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Three replicas: alice reviewed on the first, mallory on the third, then denied
    there through the admin CLI and reviewed again."""
    workdir = tmp_path_factory.mktemp("runbook")
    gateways = [start_gateway(gateway_config(), workdir, name=f"pod{i}") for i in range(3)]
    try:
        assert gateways[0].review(ALICE).json()["status"]["authenticated"] is True
        assert gateways[2].review(MALLORY).json()["status"]["authenticated"] is True
        ops = f"http://127.0.0.1:{_ops_port(gateways[2])}"
        denied = subprocess.run(
            [sys.executable, "-m", "authn_gateway", "admin", "--as", "oncall", "deny",
             "--user", "mallory", "--seconds", "600"],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "AUTHN_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
                 "AUTHN_GATEWAY_ADMIN_URL": ops},
        )  # fmt: skip
        assert denied.returncode == 0, denied.stderr
        assert gateways[2].review(MALLORY).json()["status"]["authenticated"] is False
        for gateway in gateways:
            gateway.wait_for_log('"msg":"audit"')
        gateways[2].wait_for_log('"username":"mallory","groups":null')
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()


def _ops_port(gateway: GatewayProcess) -> int:
    config = yaml.safe_load(gateway.config_path.read_text())
    port: int = config["server"]["ops"]["port"]
    return port


def lines_of(gateway: GatewayProcess) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in gateway.logs().splitlines() if line.startswith("{")]


def test_a_denied_user_is_named_in_the_review_audit_and_admin_log_lines(
    pods: list[GatewayProcess],
) -> None:
    lines = lines_of(pods[2])
    reviews = [d for d in lines if d.get("msg") == "review"]
    assert [(d["answer"], d.get("user")) for d in reviews] == [
        ("authenticated", "mallory"),
        ("rejected", "mallory"),
    ], reviews
    assert reviews[1]["reason"] == "denied by an operator (deny list)"
    audits = [d for d in lines if d.get("msg") == "audit"]
    assert [(d["outcome"], d["username"]) for d in audits] == [
        ("authenticated", "mallory"),
        ("rejected", "mallory"),
    ], audits
    assert audits[1]["groups"] is None  # a refusal grants nothing
    [admin] = [d for d in lines if str(d.get("msg", "")).startswith("admin: ")]
    assert admin["msg"].startswith("admin: deny user:mallory by oncall@"), admin
    # Never the token, in any line of any replica.
    for gateway in pods:
        assert MALLORY not in gateway.logs() and ALICE not in gateway.logs()


def kube_api(pods: list[GatewayProcess]) -> FakeKubeAPI:
    """The fake apiserver, with the rendered Deployment and its pods' logs."""
    deployment = find(render("base"), "Deployment", "authn-gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    fakes = [
        FakePod(f"authn-gateway-7d9c-{i}", labels, container["name"], gateway.logs)
        for i, gateway in enumerate(pods)
    ]
    return FakeKubeAPI(NAMESPACE, fakes, deployment)


def run(command: str, api: FakeKubeAPI, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {}}],
    }))  # fmt: skip
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        timeout=60,
    )


def test_the_runbooks_log_search_finds_the_user_on_every_replica(
    pods: list[GatewayProcess], tmp_path: Path
) -> None:
    with kube_api(pods) as api:
        found = run(find_identity_command(), api, tmp_path)
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    # Review and audit lines, the refusal included, and the audit line of the denial
    # itself, from the replica that served her, each prefixed with its pod; nothing of
    # alice's.
    assert all(line.startswith("[pod/authn-gateway-7d9c-2/authn-gateway] {") for line in lines)
    kinds = [orjson.loads(line.split("] ", 1)[1])["msg"] for line in lines]
    assert sorted(kinds) == ["admin", "audit", "audit", "review", "review"], found.stdout
    assert any("denied by an operator" in line for line in lines)
    assert "alice" not in found.stdout
    # Every replica's log was read, not one.
    logs = [r for r in api.requests if r.endswith("/log?container=authn-gateway")]
    assert len(logs) == 3, api.requests


def test_the_old_log_search_read_one_replica_and_matched_nothing(
    pods: list[GatewayProcess], tmp_path: Path
) -> None:
    # What the runbook said before: one pod of three, and a pattern with a space that
    # compact JSON never has. Kept to show why the command above is as it is.
    with kube_api(pods) as api:
        one_pod = run("kubectl -n authn-gateway logs deploy/authn-gateway", api, tmp_path)
        assert one_pod.returncode == 0, one_pod.stderr
        assert "Found 3 pods, using pod/authn-gateway-7d9c-0" in one_pod.stderr
        assert "mallory" not in one_pod.stdout
        every_pod = run(
            "kubectl -n authn-gateway logs -l app.kubernetes.io/name=authn-gateway --tail=-1",
            api,
            tmp_path,
        )
    assert "mallory" in every_pod.stdout
    assert '"user": "mallory"' not in every_pod.stdout


def kubectl_commands(text: str) -> list[str]:
    """kubectl command lines in ``text``: inline code spans and shell lines, with
    continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    # A code span may wrap: Markdown renders its line break as a space.
    spans = [" ".join(span.split()) for span in re.findall(r"`(kubectl [^`]+)`", joined)]
    lines = re.findall(r"^\s*(kubectl [^\n`]+)$", joined, re.M)
    lines += [m for m in re.findall(r"\$\((kubectl [^)]+)\)", joined)]
    return spans + lines


#: Commands on the gateway's own namespaced objects: these must say -n authn-gateway.
GATEWAY_OBJECTS = re.compile(
    r"deploy/authn-gateway|secret (generic )?authn-gateway|\bexec\b|\blogs\b|rollout|"
    r"port-forward|get pods?\b|describe certificate|get pod "
)


@pytest.mark.parametrize("doc", ["README.md", "docs/operations.md"])
def test_every_kubectl_command_on_the_gateways_objects_names_its_namespace(doc: str) -> None:
    commands = kubectl_commands((ROOT / doc).read_text())
    assert commands, doc
    on_gateway = [c for c in commands if GATEWAY_OBJECTS.search(c)]
    missing = [c for c in on_gateway if not re.search(r"(-n|--namespace)[ =]authn-gateway", c)]
    assert missing == [], f"{doc}: kubectl commands without -n authn-gateway: {missing}"


def cluster_command() -> str:
    """AuthnGatewayClusterDominatesIdP's log search, continuations joined."""
    text = OPERATIONS.read_text()
    section = text[text.index("### AuthnGatewayClusterDominatesIdP") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    command = block.replace("\\\n", " ").strip()
    assert command.startswith("kubectl ") and '"cluster":"ci"' in command, command
    return command


CALLER_TOKENS = {name: base64.b64encode(os.urandom(32)).decode() for name in ("ci", "prod")}

CI_BOT = "ci-bot-" + base64.urlsafe_b64encode(os.urandom(18)).decode()


def cluster_config() -> dict[str, Any]:
    return {
        "server": {
            "ops": {"port": free_port()},
            "caller_tokens": [
                {"name": f"{name}-apiserver", "token": token}
                for name, token in CALLER_TOKENS.items()
            ],
        },
        "logging": {"format": "json", "level": "info"},
        "clusters": [
            {"name": name, "caller_tokens": [f"{name}-apiserver"]} for name in CALLER_TOKENS
        ],
        "backends": [
            {"name": "corp", "type": "static", "tokens": [
                {"token": CI_BOT, "username": "ci-bot", "groups": ["ci"]},
                {"token": ALICE, "username": "alice", "groups": ["dev"]},
            ]},
        ],
    }  # fmt: skip


def test_the_cluster_runbooks_log_search_counts_one_clusters_answers(tmp_path: Path) -> None:
    pods = [start_gateway(cluster_config(), tmp_path, name=f"pod{i}") for i in range(2)]
    try:
        # ci's kube-apiserver sends a flood of invalid tokens and a few of ci-bot's, on
        # both replicas; prod's sends alice's, which must not be counted.
        sent = [(0, "ci", CI_BOT), (1, "ci", CI_BOT), (1, "prod", ALICE), (0, "prod", ALICE)]
        sent += [(i % 2, "ci", f"junk-{i}") for i in range(5)]
        for pod, caller, token in sent:
            response = httpx.post(
                f"{pods[pod].url}/authenticate",
                json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "spec": {"token": token}},
                headers={"Authorization": f"Bearer {CALLER_TOKENS[caller]}"},
                timeout=10,
            )  # fmt: skip
            assert response.status_code == 200, response.text
        for pod, count in ((pods[0], 5), (pods[1], 4)):
            wait = time.monotonic() + 10
            while pod.logs().count('"msg":"review"') < count and time.monotonic() < wait:
                time.sleep(0.05)
        with kube_api(pods) as api:
            found = run(cluster_command(), api, tmp_path)
    finally:
        for pod in pods:
            pod.stop()
    assert found.returncode == 0, found.stderr
    counted = {
        key: int(count)
        for count, key in (line.split(None, 1) for line in found.stdout.splitlines())
    }
    assert counted == {
        '"answer":"rejected"': 5,
        '"answer":"authenticated"': 2,
        '"user":"ci-bot"': 2,
        '"caller":"token:ci-apiserver"': 7,
    }, found.stdout
    # Sorted by count, most first.
    assert found.stdout.splitlines()[0].split(None, 1) == ["7", '"caller":"token:ci-apiserver"']
