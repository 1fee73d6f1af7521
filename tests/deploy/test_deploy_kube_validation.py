"""Every object deploy/ ships passes the validation kube-apiserver applies to it.

No kube-apiserver runs here, so its rules for our kinds are encoded in
tests/support/kube/ (each function names the Kubernetes source it follows). Each
overlay is rendered with the real ``kubectl kustomize`` and every object validated;
then each rule family is shown to refuse a broken copy of one of our own objects,
with kube's message, so that a rule which cannot fail is caught too. The first of
those is the ValidatingAdmissionPolicy as it shipped before, which a real v1.32
apiserver refused with exactly the message asserted here.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.support.kube import validate
from tests.support.kube.core import allocatable_cluster_ip, static_band
from tests.support.kustomize import DEPLOY, OVERLAYS, Doc, find, kustomize, render

#: Every kustomization an operator is told to apply, the example one included.
ALL_OVERLAYS = (*OVERLAYS, "overlays/my-cluster")

#: kubeadm's default --service-cluster-ip-range, and k3s's.
KUBEADM_SERVICE_CIDR = "10.96.0.0/12"

K3S_SERVICE_CIDR = "10.43.0.0/16"


def restricted_namespaces(docs: tuple[Doc, ...]) -> set[str]:
    return {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Namespace"
        and d["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        == "restricted"
    }


def secret_templates() -> list[Doc]:
    text = (DEPLOY / "base" / "secret.example.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_kustomize_renders_every_overlay_without_a_warning(overlay: str) -> None:
    rendering = kustomize(overlay)
    assert rendering.docs, f"{overlay} rendered nothing"
    # kustomize prints "# Warning: 'bases' is deprecated..." and the like on stderr.
    assert rendering.stderr.strip() == "", f"kustomize warned for {overlay}:\n{rendering.stderr}"


@pytest.mark.parametrize("overlay", ALL_OVERLAYS)
def test_every_rendered_object_passes_kube_apiserver_validation(overlay: str) -> None:
    docs = render(overlay)
    # The policy overlay is applied after the base: its namespace rules come from there.
    namespaces = restricted_namespaces(render("base"))
    assert namespaces == {"authn-gateway"}
    refused = {
        f"{d['kind']}/{d['metadata']['name']}": errors
        for d in docs
        if (errors := validate(d, restricted_namespaces=namespaces))
    }
    assert refused == {}, f"kube-apiserver would refuse these objects of {overlay}: {refused}"


def test_the_secret_templates_pass_kube_apiserver_validation() -> None:
    for doc in secret_templates():
        assert validate(doc) == [], (doc["kind"], doc["metadata"]["name"], validate(doc))


def test_the_policy_as_first_shipped_is_refused_with_kube_apiservers_own_message() -> None:
    [policy] = [d for d in render("policy") if d["kind"] == "ValidatingAdmissionPolicy"]
    broken = copy.deepcopy(policy)
    broken["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = ["*", "*/*"]
    # The message a real v1.32 kube-apiserver gave for `kubectl apply -k deploy/policy`.
    assert validate(broken) == [
        "spec.matchConstraints.resourceRules[0].resources: Invalid value: "
        '[]string{"*", "*/*"}: if \'*/*\' is present, must not specify other resources'
    ]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["*/*"]


# Each case breaks one rule on a copy of one of our own rendered objects; the rule
# must refuse it with kube's message. (overlay, kind, name, mutation, expected text)
Mutation = Callable[[Doc], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


POD = "spec.template.spec"

CTR = f"{POD}.containers.0"

BROKEN: list[tuple[str, str, str, Mutation, str]] = [
    ("policy", "ValidatingAdmissionPolicy", "authn-gateway-stale-identities-read-only",
     _set("spec.validations.0.reason", "Unauthorized"), "reason: Unsupported value"),
    ("policy", "ValidatingAdmissionPolicy", "authn-gateway-stale-identities-read-only",
     _set("spec.matchConstraints.resourceRules.0.operations", ["*", "CREATE"]),
     "if '*' is present, must not specify other operations"),
    ("policy", "ValidatingAdmissionPolicy", "authn-gateway-stale-identities-read-only",
     _set("spec.matchConditions.0.expression", "request.userInfo.("), "compilation failed"),
    ("policy", "ValidatingAdmissionPolicy", "authn-gateway-stale-identities-read-only",
     _set("spec.validations.0.message", "two\nlines"), "must not contain line breaks"),
    ("policy", "ValidatingAdmissionPolicyBinding", "authn-gateway-stale-identities-read-only",
     _set("spec.validationActions", ["Deny", "Warn"]), "must not contain both Deny and Warn"),
    ("base", "Service", "authn-gateway", _set("metadata.name", "authn.gateway"),
     "a DNS-1035 label"),
    ("base", "Service", "authn-gateway", _set("spec.clusterIP", "10.96.0.300"),
     "must be a valid IP address"),
    ("base", "Service", "authn-gateway-metrics",
     _set("spec.ports", [{"port": 9090}, {"port": 9091}]), "spec.ports[0].name: Required value"),
    # The load balancer other clusters' kube-apiservers call (overlays/two-clusters).
    ("overlays/two-clusters", "Service", "authn-gateway-external", _set("spec.type", "ClusterIP"),
     "may only be set for externally-accessible services"),
    ("overlays/two-clusters", "Service", "authn-gateway-external", _set("spec.type", "NodePort"),
     "loadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'"),
    ("overlays/two-clusters", "Service", "authn-gateway-external",
     _set("spec.loadBalancerSourceRanges", ["198.51.100.0/33"]), "must be a valid CIDR value"),
    ("overlays/two-clusters", "Service", "authn-gateway-external",
     _set("spec.externalTrafficPolicy", "Nearest"), "externalTrafficPolicy: Unsupported value"),
    ("base", "ConfigMap", "authn-gateway-config", _set("data", {"gateway/yaml": ""}),
     "a valid config key"),
    ("base", "Deployment", "authn-gateway", _set(f"{CTR}.ports.0.name", "https-review-port"),
     "must be no more than 15 characters"),
    ("base", "Deployment", "authn-gateway", _set(f"{CTR}.volumeMounts.0.name", "nowhere"),
     "volumeMounts[0].name: Not found"),
    ("base", "Deployment", "authn-gateway", _set(f"{CTR}.env.0.name", "1SECRET"),
     "not a valid environment variable name"),
    ("base", "Deployment", "authn-gateway",
     _set(f"{CTR}.resources.requests.memory", "1Gi"), "must be less than or equal to memory limit"),
    ("base", "Deployment", "authn-gateway", _set(f"{CTR}.livenessProbe.successThreshold", 2),
     "successThreshold: Invalid value: must be 1"),
    ("base", "Deployment", "authn-gateway", _set("spec.strategy.rollingUpdate.maxSurge", 0),
     "may not be 0 when `maxSurge` is 0"),
    ("base", "Deployment", "authn-gateway",
     _set("spec.template.metadata.labels", {"app.kubernetes.io/name": "other"}),
     "`selector` does not match template `labels`"),
    ("base", "Deployment", "authn-gateway", _set(f"{POD}.topologySpreadConstraints.0.maxSkew", 0),
     "must be greater than zero"),
    ("base", "Deployment", "authn-gateway",
     _set(f"{POD}.volumes.2.secret.items", [{"key": "client-ca.crt", "path": "../ca.crt"}]),
     "must not contain '..'"),
    # Pod Security "restricted", enforced in the namespace: the pods would be refused.
    ("base", "Deployment", "authn-gateway",
     _set(f"{CTR}.securityContext.allowPrivilegeEscalation", True),
     "check_allowPrivilegeEscalation"),
    ("base", "Deployment", "authn-gateway",
     _set(f"{POD}.volumes.0", {"name": "config", "hostPath": {"path": "/etc"}}),
     "check_hostPathVolumes"),
    ("overlays/redis-sentinel", "StatefulSet", "authn-gateway-redis",
     _set("spec.podManagementPolicy", "Random"), "must be 'OrderedReady' or 'Parallel'"),
    ("overlays/redis-sentinel", "StatefulSet", "authn-gateway-redis",
     _set(f"{POD}.containers.1.securityContext.capabilities.drop", []), "check_capabilities"),
    ("base", "PodDisruptionBudget", "authn-gateway", _set("spec.minAvailable", 2),
     "minAvailable and maxUnavailable cannot be both set"),
    ("base", "PodDisruptionBudget", "authn-gateway", _set("spec.maxUnavailable", "120%"),
     "must not be greater than 100%"),
    ("base", "NetworkPolicy", "authn-gateway",
     _set("spec.ingress.0.from.0.ipBlock.cidr", "10.0.0.1/24"), "must be a valid CIDR value"),
    ("base", "NetworkPolicy", "authn-gateway", _set("spec.ingress.0.ports.0.port", "HTTPS"),
     "must contain only alpha-numeric characters"),
    ("base", "Namespace", "authn-gateway",
     _set("metadata.labels", {"pod-security.kubernetes.io/enforce": "strict"}), "must be one of"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overlay", "kind", "name", "mutate", "expected"),
    BROKEN,
    ids=[f"{kind}-{expected[:40]}" for _, kind, _, _, expected in BROKEN],
)
def test_each_rule_refuses_a_broken_copy_of_our_object(
    overlay: str, kind: str, name: str, mutate: Mutation, expected: str
) -> None:
    original = find(render(overlay), kind, name)
    namespaces = restricted_namespaces(render("base"))
    assert validate(original, restricted_namespaces=namespaces) == []
    broken = copy.deepcopy(original)
    mutate(broken)
    errors = validate(broken, restricted_namespaces=namespaces)
    assert any(expected in e for e in errors), f"expected {expected!r} among {errors}"


def test_a_tls_secret_without_its_key_is_refused() -> None:
    [tls] = [d for d in secret_templates() if d.get("type") == "kubernetes.io/tls"]
    del tls["stringData"]["tls.key"]
    assert validate(tls) == ["data[tls.key]: Required value"]


def cluster_ip(overlay: str) -> str:
    address: str = find(render(overlay), "Service", "authn-gateway")["spec"]["clusterIP"]
    return address


def test_the_base_cluster_ip_is_only_valid_in_a_cluster_whose_service_cidr_holds_it() -> None:
    base_ip = cluster_ip("base")
    assert allocatable_cluster_ip(base_ip, KUBEADM_SERVICE_CIDR) == []
    # In the low band dynamic allocation avoids, so no other Service can hold it.
    assert ipaddress.ip_address(base_ip) in static_band(KUBEADM_SERVICE_CIDR)
    # What the issue saw on a cluster with another range:
    [refusal] = allocatable_cluster_ip(base_ip, K3S_SERVICE_CIDR)
    assert f"the provided IP ({base_ip}) is not in the valid range" in refusal
    # The first address of any range is the kubernetes Service's own.
    assert "already allocated" in allocatable_cluster_ip("10.96.0.1", KUBEADM_SERVICE_CIDR)[0]


def test_the_example_overlay_changes_only_the_cluster_addresses() -> None:
    base, mine = render("base"), render("overlays/my-cluster")
    mine_ip = cluster_ip("overlays/my-cluster")
    assert allocatable_cluster_ip(mine_ip, K3S_SERVICE_CIDR) == []
    assert ipaddress.ip_address(mine_ip) in static_band(K3S_SERVICE_CIDR)
    policy = find(mine, "NetworkPolicy", "authn-gateway")
    assert (
        policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"]
        != find(base, "NetworkPolicy", "authn-gateway")["spec"]["ingress"][0]["from"][0]["ipBlock"][
            "cidr"
        ]
    )
    changed = [
        (a["kind"], a["metadata"]["name"]) for a, b in zip(base, mine, strict=True) if a != b
    ]
    assert changed == [("Service", "authn-gateway"), ("NetworkPolicy", "authn-gateway")]
