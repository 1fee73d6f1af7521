"""One gateway serving two clusters, as deploy/overlays/two-clusters ships it and
docs/operations.md ("Serving several clusters") walks through it.

The overlay renders to the base plus a load balancer for the second cluster and that
cluster's control plane in the NetworkPolicy; its config is the base's with both
clusters named. Then its pod is projected (tests/support/kubelet.py) with real
certificates: a serving certificate with the SANs the docs list, a webhook client CA,
prod's client certificate and staging's, made by the docs' own openssl commands. A
real gateway process serves the projected config; each cluster's kube-apiserver is
played from its shipped webhook kubeconfig (its server name verified against the
serving certificate, its client certificate presented) and counted under its cluster.
Last, a third cluster joins by the documented steps: the addition checked in the pod
with the documented command, the reload loop's own script waiting for the mounted file
and sending SIGHUP, and ``authn-gateway review --cluster dev``; no restart.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.support import kubelet
from tests.support.deploy_pod import cluster_objects, container
from tests.support.fakes.idp import FakeIdP
from tests.support.kube.kubeconfig import confirm_usable, load_kubeconfig
from tests.support.kustomize import DEPLOY, Doc, config_of, find, kustomize, render
from tests.support.pki import Issued, issue, make_ca
from tests.support.procs import GatewayProcess, free_port, metric_value, review_body, wait_for_port
from tests.support.prometheus_helpers import wait_until

OVERLAY = "overlays/two-clusters"

OVERLAY_DIR = DEPLOY / OVERLAY

OPERATIONS = DEPLOY.parent / "docs" / "operations.md"

#: Where the webhook kubeconfig and its files live on a control-plane node.
NODE_DIR = "/etc/kubernetes/authn-webhook"

#: The path the Deployment reads its config from, as the pod sees it.
POD_CONFIG = "/etc/authn-gateway/config/gateway.yaml"

#: The venv's authn-gateway, as the image has it on PATH.
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

REVIEWS = "authn_gateway_cluster_reviews_total"


def section(heading: str) -> str:
    text = OPERATIONS.read_text()
    start = text.index(f"### {heading}\n")
    return text[start : text.index("\n### ", start + 1)]


def blocks(heading: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` under ``heading``, indentation removed and
    shell continuations joined."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```", section(heading), re.S | re.M)
    out = []
    for indent, body in found:
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        out.append(re.sub(r"\\\n\s*", "", "\n".join(lines)))
    return out


def inner_script(command: str) -> str:
    """The script a documented ``kubectl exec ... -- sh -c '...'`` runs in the pod."""
    match = re.search(r"sh -c '([^']*)'", command)
    assert match is not None, command
    return match.group(1)


def kubeconfig(cluster: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (OVERLAY_DIR / f"webhook-kubeconfig-{cluster}.yaml").read_text()
    )
    return loaded


def with_addition(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the docs' addition: each of its list items appended."""
    [snippet] = blocks("Add a cluster without a restart", "yaml")
    addition = yaml.safe_load(snippet)
    new = copy.deepcopy(config)
    new["server"]["allowed_subjects"] += addition["server"]["allowed_subjects"]
    new["clusters"] += addition["clusters"]
    return new


# --- what the overlay renders --------------------------------------------------------


def test_the_config_is_the_bases_with_both_clusters_named_by_their_certificates() -> None:
    config, base = config_of(render(OVERLAY)), config_of(render("base"))
    subjects = config["server"]["allowed_subjects"]
    assert {k: v for k, v in config.items() if k != "clusters"} == {
        **base,
        "server": {**base["server"], "allowed_subjects": subjects},
    }
    assert [c["name"] for c in config["clusters"]] == ["prod", "staging"]
    # prod keeps the certificate the base allows; every allowed name is one cluster's,
    # so no kube-apiserver is the cluster default.
    assert config["clusters"][0]["subjects"] == base["server"]["allowed_subjects"]
    named = [s for c in config["clusters"] for s in c["subjects"]]
    assert sorted(named) == sorted(subjects) and len(set(named)) == len(named)


def test_each_cluster_reaches_the_review_port_its_kubeconfig_names() -> None:
    docs = render(OVERLAY)
    config = config_of(docs)
    service = find(docs, "Service", "authn-gateway")
    external = find(docs, "Service", "authn-gateway-external")
    pod_labels = find(docs, "Deployment", "authn-gateway")["spec"]["template"]["metadata"]
    assert all(pod_labels["labels"].get(k) == v for k, v in external["spec"]["selector"].items())
    [port] = external["spec"]["ports"]
    assert port["targetPort"] == "https"
    path = config["server"]["review_path"]
    prod = kubeconfig("prod")["clusters"][0]["cluster"]["server"]
    assert prod == f"https://{service['spec']['clusterIP']}:443{path}"
    staging = urlsplit(kubeconfig("staging")["clusters"][0]["cluster"]["server"])
    assert (staging.scheme, staging.port, staging.path) == ("https", port["port"], path)
    assert staging.hostname is not None and not staging.hostname[0].isdigit()
    # The load balancer admits staging's control plane, and so does the NetworkPolicy,
    # which sees that address because kube-proxy does not SNAT with Local.
    assert external["spec"]["externalTrafficPolicy"] == "Local"
    policy = find(docs, "NetworkPolicy", "authn-gateway")
    blocks_ = [s["ipBlock"]["cidr"] for s in policy["spec"]["ingress"][0]["from"]]
    base_policy = find(render("base"), "NetworkPolicy", "authn-gateway")
    assert blocks_[0] == base_policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"]
    assert blocks_[1:] == external["spec"]["loadBalancerSourceRanges"]
    # Both install where deploy/apiserver's flags and kubeadm patch point, with that
    # kubeconfig's file names: only the server and the certificate differ.
    shipped = yaml.safe_load((DEPLOY / "apiserver" / "webhook-kubeconfig.yaml").read_text())
    flags = (DEPLOY / "apiserver" / "kube-apiserver-flags.txt").read_text()
    assert f"--authentication-token-webhook-config-file={NODE_DIR}/kubeconfig.yaml" in flags
    for cluster in ("prod", "staging"):
        mine = kubeconfig(cluster)
        user, theirs = mine["users"][0]["user"], shipped["users"][0]["user"]
        assert user == {k: theirs[k] for k in ("client-certificate", "client-key")}
        ca = mine["clusters"][0]["cluster"]["certificate-authority"]
        assert ca == shipped["clusters"][0]["cluster"]["certificate-authority"]
        assert mine["current-context"] == mine["contexts"][0]["name"]


def test_each_clusters_authorization_kubeconfig_is_its_webhook_kubeconfig_at_authorize() -> None:
    # docs/operations.md, step 4: that cluster's webhook kubeconfig with /authorize in
    # place of /authenticate; prod's is deploy/apiserver's, staging's the load balancer.
    shipped = yaml.safe_load((DEPLOY / "apiserver" / "authz-webhook-kubeconfig.yaml").read_text())
    step = section("Two clusters, one gateway").split("\n4. ", 1)[1].split("\n5. ", 1)[0]
    assert "`/authorize` in place of `/authenticate`" in step
    path = config_of(render(OVERLAY))["authorization"].get("path", "/authorize")
    files = {f"{NODE_DIR}/{n}" for n in ("gateway-ca.crt", "client.crt", "client.key")}
    for cluster in ("prod", "staging"):
        authz = copy.deepcopy(kubeconfig(cluster))
        server = authz["clusters"][0]["cluster"]["server"]
        assert server.endswith("/authenticate")
        authz["clusters"][0]["cluster"]["server"] = server.removesuffix("/authenticate") + path
        assert confirm_usable(load_kubeconfig(authz), files.__contains__) == [], cluster
        if cluster == "prod":
            assert authz == shipped
        else:
            assert urlsplit(authz["clusters"][0]["cluster"]["server"]).path == path


def copy_of_deploy(tmp_path: Path) -> Path:
    """deploy/ copied, so that an overlay can be edited and rendered as an operator would."""
    target = tmp_path / "deploy"
    shutil.copytree(DEPLOY, target)
    return target


def fresh(directory: Path) -> tuple[Doc, ...]:
    """``directory`` rendered now (render() keeps what it rendered once per path)."""
    docs: tuple[Doc, ...] = kustomize.__wrapped__(directory).docs
    return docs


def test_adding_a_cluster_changes_the_config_in_place_and_rolls_nothing_out(
    tmp_path: Path,
) -> None:
    deploy = copy_of_deploy(tmp_path)
    before = fresh(deploy / OVERLAY)
    path = deploy / OVERLAY / "gateway.yaml"
    path.write_text(yaml.safe_dump(with_addition(yaml.safe_load(path.read_text()))))
    after = fresh(deploy / OVERLAY)
    # `kubectl apply -k` updates the ConfigMap of the same name; the Deployment's pod
    # template is unchanged, so no pod is replaced.
    assert [(d["kind"], d["metadata"]["name"]) for d in after] == [
        (d["kind"], d["metadata"]["name"]) for d in before
    ]
    changed = [d["metadata"]["name"] for a, d in zip(before, after, strict=True) if a != d]
    assert changed == ["authn-gateway-config"]
    assert [c["name"] for c in config_of(after)["clusters"]] == ["prod", "staging", "dev"]
    # The base's config, by contrast, rolls out: a changed file is a new name.
    base = deploy / "base" / "gateway.yaml"
    base_before = find(fresh(deploy / "base"), "ConfigMap", "authn-gateway-config")
    base.write_text(base.read_text() + "\n# changed\n")
    base_after = find(fresh(deploy / "base"), "ConfigMap", "authn-gateway-config")
    assert base_before["metadata"]["name"] != base_after["metadata"]["name"]


def test_my_cluster_composes_with_two_clusters(tmp_path: Path) -> None:
    # What the docs say to do for one's own addresses: my-cluster over ../two-clusters.
    deploy = copy_of_deploy(tmp_path)
    mine = deploy / "overlays" / "my-cluster" / "kustomization.yaml"
    text = mine.read_text()
    assert "  - ../../base" in text
    mine.write_text(text.replace("  - ../../base", "  - ../two-clusters", 1))
    docs = fresh(mine.parent)
    policy = find(docs, "NetworkPolicy", "authn-gateway")
    cidrs = [s["ipBlock"]["cidr"] for s in policy["spec"]["ingress"][0]["from"]]
    assert cidrs == ["192.168.10.0/28", "198.51.100.0/28"]
    assert find(docs, "Service", "authn-gateway")["spec"]["clusterIP"] == "10.43.0.53"
    assert [c["name"] for c in config_of(docs)["clusters"]] == ["prod", "staging"]


# --- one gateway process, two kube-apiservers ---------------------------------------


@dataclass
class Pod:
    root: Path
    mounts: list[kubelet.Mount]
    gateway: GatewayProcess
    ops_port: int
    env: dict[str, str]
    server_ca: Issued
    client_ca: Issued
    idp: FakeIdP

    @property
    def config_path(self) -> Path:
        return self.root / POD_CONFIG.lstrip("/")


def runnable_here(config: dict[str, Any], port: int, ops_port: int, idp: str) -> dict[str, Any]:
    """The pod's config as this machine can run it: loopback and free ports (listener
    settings only), and the backend pointed at the fake IdP."""
    config = copy.deepcopy(config)
    config["server"].update(host="127.0.0.1", port=port)
    config["server"]["ops"]["port"] = ops_port
    config["backends"][0]["url"] = idp
    return config


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    workdir = tmp_path_factory.mktemp("two-clusters")
    docs = render(OVERLAY)
    spec, ctr = container(docs)
    # The serving certificate with the SANs the docs list: the ClusterIP (prod) and
    # the load balancer's name (staging).
    cluster_ip = find(docs, "Service", "authn-gateway")["spec"]["clusterIP"]
    staging_host = urlsplit(kubeconfig("staging")["clusters"][0]["cluster"]["server"]).hostname
    assert staging_host is not None
    server_ca, client_ca = make_ca("gateway serving CA"), make_ca("webhook client CA")
    serving = issue(server_ca, "authn-gateway", server=True, ip=cluster_ip, dns=(staging_host,))
    objects = cluster_objects(docs, set())
    objects[("Secret", "authn-gateway")]["stringData"]["client-ca.crt"] = (
        client_ca.cert_pem().decode()
    )
    objects[("Secret", "authn-gateway-tls")]["stringData"] = {
        "tls.crt": serving.cert_pem().decode(),
        "tls.key": serving.key_pem().decode(),
    }
    mounts = kubelet.mounts(spec, ctr, objects)
    root = workdir / "pod"
    kubelet.materialize(root, mounts)
    cm = find(docs, "ConfigMap", "authn-gateway-config")
    config = yaml.safe_load(kubelet.under_root(cm["data"]["gateway.yaml"], root, mounts))
    idp = FakeIdP(control_port=0).start_in_thread()
    port, ops_port = free_port(), free_port()
    config_path = root / POD_CONFIG.lstrip("/")
    config_path.write_text(yaml.safe_dump(runnable_here(config, port, ops_port, idp.url)))
    env = kubelet.environment(ctr, objects)
    log_path = workdir / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "authn_gateway", "serve", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    gateway = GatewayProcess(proc, port, config_path, log_path)
    try:
        wait_for_port(port, proc=proc)
        yield Pod(root, mounts, gateway, ops_port, env, server_ca, client_ca, idp)
    finally:
        gateway.stop()
        idp.stop()


def control_plane_node(pod: Pod, tmp_path: Path, cluster: str, cn: str) -> Path:
    """A control-plane node's /etc/kubernetes/authn-webhook, as the docs say to fill
    it: ``cluster``'s kubeconfig, the serving CA, and a client certificate for ``cn``
    (staging's made by the docs' own openssl commands)."""
    node = tmp_path / cluster / NODE_DIR.lstrip("/")
    node.mkdir(parents=True)
    (node / "kubeconfig.yaml").write_text(
        # dev's kube-apiservers call from outside, as staging's do.
        (OVERLAY_DIR / f"webhook-kubeconfig-{'prod' if cluster == 'prod' else 'staging'}.yaml")
        .read_text()
        .replace(NODE_DIR, str(node))
    )
    (node / "gateway-ca.crt").write_bytes(pod.server_ca.cert_pem())
    if cluster == "prod":
        issue(pod.client_ca, cn, server=False).write(node, "client")
        return node
    (node / "webhook-client-ca.crt").write_bytes(pod.client_ca.cert_pem())
    (node / "webhook-client-ca.key").write_bytes(pod.client_ca.key_pem())
    [openssl] = blocks("Two clusters, one gateway", "sh")
    assert '-subj "/CN=kube-apiserver-staging"' in openssl
    made = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", openssl.replace("kube-apiserver-staging", cn)],
        cwd=node,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return node


def kube_apiserver_review(pod: Pod, node: Path, token: str) -> httpx.Response:
    """A TokenReview as kube-apiserver sends it with the kubeconfig in ``node``: to its
    server (here on loopback, the name verified as the server's), with its CA and its
    client certificate."""
    config = yaml.safe_load((node / "kubeconfig.yaml").read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    user = config["users"][0]["user"]
    tls = ssl.create_default_context(
        cafile=config["clusters"][0]["cluster"]["certificate-authority"]
    )
    tls.load_cert_chain(user["client-certificate"], user["client-key"])
    with httpx.Client(verify=tls, timeout=10) as client:
        return client.post(
            f"https://127.0.0.1:{pod.gateway.port}{server.path}?timeout=30s",
            json=review_body(token),
            extensions={"sni_hostname": server.hostname},
        )


def authenticated(pod: Pod, node: Path, token: str) -> bool:
    response = kube_apiserver_review(pod, node, token)
    assert response.status_code == 200, response.text
    return bool(response.json()["status"]["authenticated"])


def scrape(pod: Pod) -> str:
    return httpx.get(f"http://127.0.0.1:{pod.ops_port}/metrics", timeout=5).text


def logged_clusters(pod: Pod, count: int) -> list[str]:
    """The cluster of each review line (JSON, as deploy/ logs), once ``count`` are written."""

    def clusters() -> list[str]:
        return re.findall(r'"msg":"review".*?"cluster":"([a-z0-9-]+)"', pod.gateway.logs())

    wait_until(lambda: len(clusters()) >= count, 10, f"{count} review lines")
    return clusters()


def test_each_clusters_kube_apiserver_is_served_through_its_kubeconfig_under_its_name(
    pod: Pod, tmp_path: Path
) -> None:
    prod = control_plane_node(pod, tmp_path, "prod", "kube-apiserver-authn-webhook")
    staging = control_plane_node(pod, tmp_path, "staging", "kube-apiserver-staging")
    for i in range(3):
        assert authenticated(pod, prod, f"good-alice~{i}@prod")
    assert authenticated(pod, staging, "good-bob@staging")
    assert not authenticated(pod, staging, "not-a-token@staging")
    text = scrape(pod)
    assert metric_value(text, REVIEWS, cluster="prod", answer="authenticated") == 3
    assert metric_value(text, REVIEWS, cluster="staging", answer="authenticated") == 1
    assert metric_value(text, REVIEWS, cluster="staging", answer="rejected") == 1
    assert metric_value(text, REVIEWS, cluster="default") == 0
    by_tag = pod.idp.stats().by_tag
    calls = "authn_gateway_cluster_idp_calls_total"
    for cluster, count in (("prod", 3), ("staging", 2)):
        assert by_tag[cluster].calls == count == metric_value(text, calls, cluster=cluster)
    assert logged_clusters(pod, 5)[:5] == ["prod"] * 3 + ["staging"] * 2


def test_a_certificate_no_cluster_names_is_refused(pod: Pod, tmp_path: Path) -> None:
    before = metric_value(scrape(pod), "authn_gateway_bad_requests_total", status="401")
    dev = control_plane_node(pod, tmp_path, "dev", "kube-apiserver-dev")
    response = kube_apiserver_review(pod, dev, "good-dora@dev")
    assert response.status_code == 401
    after = metric_value(scrape(pod), "authn_gateway_bad_requests_total", status="401")
    assert after == before + 1
    assert "dev" not in pod.idp.stats().by_tag


def check_in_the_pod(pod: Pod, text: str) -> subprocess.CompletedProcess[str]:
    """Step 2: the documented check's script, run where the pod's files are."""
    [check, _apply, _reload, _review] = blocks("Add a cluster without a restart", "sh")
    assert check.startswith("kubectl -n authn-gateway exec -i deploy/authn-gateway")
    assert check.rstrip().endswith("< deploy/overlays/two-clusters/gateway.yaml")
    return in_the_pod(pod, inner_script(check).replace("/tmp/", f"{pod.root}/tmp/"), stdin=text)


def in_the_pod(
    pod: Pod, command: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` through sh (the image's shell) with the container's environment."""
    return subprocess.run(
        ["sh", "-c", command],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **pod.env, "PATH": PATH},
        timeout=60,
    )


def pod_text(pod: Pod, config: dict[str, Any]) -> str:
    """``config`` (the overlay's file) with its paths where the projected pod has them."""
    return kubelet.under_root(yaml.safe_dump(config), pod.root, pod.mounts)


def test_a_third_cluster_joins_by_the_documented_reload_without_a_restart(
    pod: Pod, tmp_path: Path
) -> None:
    pid = pod.gateway.proc.pid
    dev = control_plane_node(pod, tmp_path, "dev", "kube-apiserver-dev")
    overlay = yaml.safe_load((OVERLAY_DIR / "gateway.yaml").read_text())
    added = with_addition(overlay)
    # Step 2 refuses a bad addition in one line naming the field, and passes the right one.
    bad = copy.deepcopy(added)
    bad["clusters"][-1]["subjects"] = ["kube-apiserver-staging"]
    refused = check_in_the_pod(pod, pod_text(pod, bad))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    problems = [line for line in refused.stderr.splitlines() if "clusters[" in line]
    assert len(problems) == 1, refused.stderr
    assert "clusters[2].subjects[0]: 'kube-apiserver-staging' is also clusters[1]'s" in problems[0]
    checked = check_in_the_pod(pod, pod_text(pod, added))
    assert checked.returncode == 0, checked.stderr
    assert ": ok; backends:" in checked.stdout

    # Step 4: the loop's script waits in the pod until kubelet has updated the mounted
    # file (step 3's apply), then signals the gateway (PID 1 in the container).
    [_check, apply, reload, review] = blocks("Add a cluster without a restart", "sh")
    assert apply.strip() == "kubectl apply -k deploy/overlays/two-clusters"
    script = (
        inner_script(reload)
        .replace(POD_CONFIG, str(pod.config_path))
        .replace("kill -HUP 1", f"kill -HUP {pid}")
        .replace("sleep 5", "sleep 0.1")
    )
    waiting = subprocess.Popen(["sh", "-c", script])
    try:
        time.sleep(0.5)
        assert waiting.poll() is None, "the reload did not wait for the file"
        assert "config reloaded" not in pod.gateway.logs()
        new = runnable_here(
            yaml.safe_load(pod_text(pod, added)), pod.gateway.port, pod.ops_port, pod.idp.url
        )
        pod.config_path.write_text(yaml.safe_dump(new))  # kubelet's update
        assert waiting.wait(timeout=15) == 0
    finally:
        if waiting.poll() is None:
            waiting.kill()
    pod.gateway.wait_for_log("config reloaded from")
    assert metric_value(scrape(pod), "authn_gateway_config_last_reload_successful") == 1

    # Step 5: a review as dev through the running config.
    assert review.startswith("kubectl -n authn-gateway exec -i deploy/authn-gateway")
    command = review.split(" -- ", 1)[1].replace(POD_CONFIG, str(pod.config_path))
    (tmp_path / "token.txt").write_text("good-dora@dev\n")
    reviewed = in_the_pod(pod, command, cwd=tmp_path)
    assert reviewed.returncode == 0, reviewed.stderr
    assert "cluster dev: authenticated by corp-idp" in reviewed.stderr

    # dev's kube-apiserver, refused before, is served and counted as dev; same process.
    assert authenticated(pod, dev, "good-dora~1@dev")
    text = scrape(pod)
    assert metric_value(text, REVIEWS, cluster="dev", answer="authenticated") == 1
    assert logged_clusters(pod, 6)[-1] == "dev"
    assert pod.gateway.proc.pid == pid and pod.gateway.proc.poll() is None
