"""deploy/ renders with kubectl kustomize, parses as Kubernetes objects, and agrees with
itself: ports, paths, selectors, the webhook kubeconfig and the kubeadm patch."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.support.kube.kubeadm import apply_json_patch, static_pod
from tests.support.kustomize import (
    DEPLOY,
    GATEWAY_OVERLAYS,
    config_of,
    find,
    labels_match,
    render,
)


@pytest.mark.parametrize("directory", GATEWAY_OVERLAYS)
def test_manifests_render_to_kubernetes_objects(directory: str) -> None:
    docs = render(directory)
    assert docs
    for doc in docs:
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"]
        assert isinstance(doc.get("kind"), str) and doc["kind"]
        assert doc["metadata"]["name"]
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "authn-gateway"
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
    }


def test_deployment_runs_three_spread_replicas_with_a_restrictive_security_context() -> None:
    deployment = find(render("base"), "Deployment", "authn-gateway")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["image"].startswith("registry.example.com/authn-gateway:")


def test_deployment_ports_and_mounts_agree_with_the_shipped_config() -> None:
    docs = render("base")
    config = config_of(docs)
    pod = find(docs, "Deployment", "authn-gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["https"] == config["server"]["port"]
    assert ports["metrics"] == config["server"]["ops"]["port"]
    assert config["server"]["host"] == "0.0.0.0"
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    config_path = container["args"][container["args"].index("--config") + 1]
    tls = config["server"]["tls"]
    for path in (config_path, tls["cert_file"], tls["key_file"], tls["client_ca_file"]):
        assert any(path.startswith(m + "/") for m in mounts), path
    # TLS reloads stage files in /tmp, the only writable mount.
    assert "/tmp" in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm_name = find(docs, "ConfigMap", "authn-gateway-config")["metadata"]["name"]
    assert volumes["config"]["configMap"]["name"] == cm_name


def test_services_pdb_and_policies_select_the_gateway_pods() -> None:
    docs = render("base")
    deployment = find(docs, "Deployment", "authn-gateway")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    for doc in docs:
        if doc["kind"] == "Service":
            assert labels_match(doc["spec"]["selector"], pod_labels)
    pdb = find(docs, "PodDisruptionBudget", "authn-gateway")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1
    policy = find(docs, "NetworkPolicy", "authn-gateway")
    assert labels_match(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    admitted = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert admitted == ["https", "metrics"]


def test_service_monitor_scrapes_only_the_metrics_service() -> None:
    docs = render("base")
    monitor = find(docs, "ServiceMonitor", "authn-gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service" and labels_match(selector, d["metadata"]["labels"])
    ]
    assert selected == ["authn-gateway-metrics"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_dashboard_configmap_carries_the_dashboard_json() -> None:
    cm = find(render("base"), "ConfigMap", "authn-gateway-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["grafana-dashboard.json"])
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("breaker state", "reviews by answer", "backend call latency"):
        assert wanted in titles
    for wanted in ("cache hit ratio", "stale", "limiter drops"):
        assert wanted in titles
    for wanted in ("reviews by cluster", "idp calls by cluster", "shed calls by cluster"):
        assert wanted in titles
    for wanted in ("subjectaccessreviews by answer", "authorization policy reloads"):
        assert wanted in titles


def test_redis_overlay_adds_redis_and_points_the_config_at_it() -> None:
    docs = render("overlays/redis")
    config = config_of(docs)
    service = find(docs, "Service", "authn-gateway-redis")
    assert f"//{service['metadata']['name']}:6379" in config["redis"]["url"]
    redis = find(docs, "Deployment", "authn-gateway-redis")
    pod = redis["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert labels_match(
        service["spec"]["selector"], redis["spec"]["template"]["metadata"]["labels"]
    )
    # The gateway's own labels must not leak onto Redis (its policy admits the gateway).
    assert redis["metadata"]["labels"]["app.kubernetes.io/name"] == "authn-gateway-redis"
    policy = find(docs, "NetworkPolicy", "authn-gateway-redis")
    gateway = find(docs, "Deployment", "authn-gateway")
    (source,) = policy["spec"]["ingress"][0]["from"]
    assert labels_match(
        source["podSelector"]["matchLabels"], gateway["spec"]["template"]["metadata"]["labels"]
    )
    # Apart from redis:, the fleet config is the base config.
    base = config_of(render("base"))
    assert {k: v for k, v in config.items() if k != "redis"} == base


def test_redis_overlay_keeps_drains_from_evicting_its_only_redis() -> None:
    docs = render("overlays/redis")
    redis = find(docs, "Deployment", "authn-gateway-redis")
    assert redis["spec"]["replicas"] == 1
    pdb = find(docs, "PodDisruptionBudget", "authn-gateway-redis")
    assert labels_match(
        pdb["spec"]["selector"]["matchLabels"], redis["spec"]["template"]["metadata"]["labels"]
    )
    # One memory-only Redis: evicting it empties the shared cache.
    assert pdb["spec"]["maxUnavailable"] == 0
    gateway = find(docs, "Deployment", "authn-gateway")
    assert not labels_match(
        pdb["spec"]["selector"]["matchLabels"], gateway["spec"]["template"]["metadata"]["labels"]
    )


SENTINEL = DEPLOY / "overlays" / "redis-sentinel"


def test_sentinel_overlay_points_the_gateway_at_every_sentinel_by_stable_name() -> None:
    docs = render("overlays/redis-sentinel")
    redis = find(docs, "StatefulSet", "authn-gateway-redis")
    replicas = redis["spec"]["replicas"]
    assert replicas == 3
    headless = find(docs, "Service", redis["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert labels_match(headless["spec"]["selector"], pod_labels)
    assert {p["port"] for p in headless["spec"]["ports"]} == {6379, 26379}
    config = config_of(docs)["redis"]
    name, service = redis["metadata"]["name"], headless["metadata"]["name"]
    assert config["sentinels"] == [f"{name}-{i}.{service}:26379" for i in range(replicas)]
    assert "url" not in config
    # start.sh names the same master, the same pods and the same headless Service.
    script = (SENTINEL / "start.sh").read_text()
    assert f"master_name={config['sentinel_master']}\n" in script
    assert f"headless={service}\n" in script
    assert f'peer="{name}-${{i}}.${{headless}}"' in script
    assert "for i in " + " ".join(str(i) for i in range(replicas)) + "; do" in script
    # Apart from redis:, the fleet config is the base config.
    base = config_of(render("base"))
    assert {k: v for k, v in config_of(docs).items() if k != "redis"} == base


def test_sentinel_overlay_pods_run_redis_and_sentinel_from_the_shipped_script() -> None:
    docs = render("overlays/redis-sentinel")
    redis = find(docs, "StatefulSet", "authn-gateway-redis")
    pod = redis["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {c["name"]: c["command"][-1] for c in pod["containers"]} == {
        "redis": "redis",
        "sentinel": "sentinel",
    }
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["command"][:2] == ["sh", "/scripts/start.sh"]
    scripts = find(docs, "ConfigMap", "authn-gateway-redis-scripts")
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == scripts["metadata"]["name"]
    assert scripts["data"]["start.sh"] == (SENTINEL / "start.sh").read_text()
    result = subprocess.run(
        ["sh", "-n", str(SENTINEL / "start.sh")], capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 0, result.stderr


def test_sentinel_overlay_drains_one_redis_at_a_time_and_admits_only_its_peers() -> None:
    docs = render("overlays/redis-sentinel")
    redis = find(docs, "StatefulSet", "authn-gateway-redis")
    pod_labels = redis["spec"]["template"]["metadata"]["labels"]
    pdb = find(docs, "PodDisruptionBudget", "authn-gateway-redis")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    # Three Sentinels with a quorum of two: one may go.
    assert pdb["spec"]["maxUnavailable"] == 1
    policy = find(docs, "NetworkPolicy", "authn-gateway-redis")
    assert labels_match(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    (rule,) = policy["spec"]["ingress"]
    gateway = find(docs, "Deployment", "authn-gateway")
    sources = [s["podSelector"]["matchLabels"] for s in rule["from"]]
    assert any(labels_match(s, gateway["spec"]["template"]["metadata"]["labels"]) for s in sources)
    assert any(labels_match(s, pod_labels) for s in sources)
    assert {p["port"] for p in rule["ports"]} == {"redis", "sentinel"}
    assert redis["metadata"]["labels"]["app.kubernetes.io/name"] == "authn-gateway-redis"


def test_secret_template_is_kept_out_of_the_kustomization() -> None:
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert "secret.example.yaml" not in kustomization["resources"]
    docs = [d for d in yaml.safe_load_all((DEPLOY / "base" / "secret.example.yaml").read_text())]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Secret", "authn-gateway") in names
    assert ("Secret", "authn-gateway-tls") in names
    deployment = find(render("base"), "Deployment", "authn-gateway")
    pod = deployment["spec"]["template"]["spec"]
    used = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    (container,) = pod["containers"]
    used |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert used <= {name for _, name in names}
    secret = next(d for d in docs if d["metadata"]["name"] == "authn-gateway")
    for volume in pod["volumes"]:
        for item in volume.get("secret", {}).get("items", []):
            if volume["secret"]["secretName"] == "authn-gateway":
                assert item["key"] in secret["stringData"]


def test_webhook_kubeconfig_points_at_the_service_over_mutual_tls() -> None:
    docs = render("base")
    kubeconfig = yaml.safe_load((DEPLOY / "apiserver" / "webhook-kubeconfig.yaml").read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    service = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "authn-gateway"
    )
    config = config_of(docs)
    assert cluster["server"] == (
        f"https://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
        f"{config['server']['review_path']}"
    )
    assert cluster["certificate-authority"].startswith("/etc/kubernetes/authn-webhook/")
    user = kubeconfig["users"][0]["user"]
    assert user["client-certificate"].startswith("/etc/kubernetes/authn-webhook/")
    assert user["client-key"].startswith("/etc/kubernetes/authn-webhook/")
    assert kubeconfig["current-context"] == kubeconfig["contexts"][0]["name"]


def test_kubeadm_patch_adds_the_webhook_flags_and_mount() -> None:
    patch = yaml.safe_load(
        (DEPLOY / "apiserver" / "kubeadm-patches" / "kube-apiserver+json.yaml").read_text()
    )
    # The static pod as kubeadm writes it, patched as kubeadm patches it
    # (tests/support/kube/kubeadm.py); its authorization flags are
    # tests/deploy/test_apiserver_authorization.py's.
    written = static_pod([])
    patched = apply_json_patch(written, patch)
    before = written["spec"]["containers"][0]["command"]
    command = patched["spec"]["containers"][0]["command"]
    flags = (DEPLOY / "apiserver" / "kube-apiserver-flags.txt").read_text().split()
    assert command[len(before) :] == flags
    kubeadms_own = [c for c in before if not c.startswith("--authorization-")]
    assert [c for c in command[: len(before)] if not c.startswith("--authorization-")] == (
        kubeadms_own
    )
    flag_map = dict(f.removeprefix("--").split("=", 1) for f in flags)
    assert flag_map["authentication-token-webhook-version"] == "v1"
    kubeconfig_path = flag_map["authentication-token-webhook-config-file"]
    (mount,) = [
        m for m in patched["spec"]["containers"][0]["volumeMounts"] if m["name"] != "k8s-certs"
    ]
    assert kubeconfig_path.startswith(mount["mountPath"] + "/")
    volume = next(v for v in patched["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == mount["mountPath"]
    # The ClusterConfiguration route sets the same flags.
    cluster_config = yaml.safe_load((DEPLOY / "apiserver" / "kubeadm-config.yaml").read_text())
    # kubeadm.k8s.io/v1beta4 (kubeadm 1.31+) lists extraArgs as name/value pairs.
    assert cluster_config["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    args = cluster_config["apiServer"]["extraArgs"]
    authentication = {a["name"]: a["value"] for a in args if a["name"].startswith("authentic")}
    assert authentication == flag_map


def test_readme_wiring_matches_the_shipped_kubeconfig_and_flags() -> None:
    readme = (DEPLOY.parent / "README.md").read_text()
    kubeconfig = yaml.safe_load((DEPLOY / "apiserver" / "webhook-kubeconfig.yaml").read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    user = kubeconfig["users"][0]["user"]
    for value in (
        cluster["server"],
        cluster["certificate-authority"],
        user["client-certificate"],
        user["client-key"],
    ):
        assert value in readme
    for flag in (DEPLOY / "apiserver" / "kube-apiserver-flags.txt").read_text().split():
        assert flag in readme
    service = find(render("base"), "Service", "authn-gateway")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] != "metrics")
    assert cluster["server"] == f"https://{service['spec']['clusterIP']}:{port}/authenticate"
    assert "/etc/kubernetes/authn-gateway" not in readme
    assert "Prometheus\nOperator" in readme or "Prometheus Operator" in readme


def test_the_readme_checks_the_prometheus_operator_crds_before_applying() -> None:
    readme = (DEPLOY.parent / "README.md").read_text()
    section = readme[readme.index("## Deploy to a cluster") :]
    crds = "servicemonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com"
    assert crds in section
    assert section.index(crds) < section.index("kubectl apply -k")


def test_the_walkthrough_creates_the_namespace_before_the_secrets() -> None:
    for doc in ("README.md", "docs/operations.md"):
        text = (DEPLOY.parent / doc).read_text()
        assert text.index("deploy/base/namespace.yaml") < text.index("secret.example.yaml"), doc


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) >= 2
    assert all("slim" in stage for stage in stages)
    final = lines[lines.index(stages[-1]) :]
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    deployment = find(render("base"), "Deployment", "authn-gateway")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert not any(line.startswith(("RUN apt", "RUN pip")) for line in final)
