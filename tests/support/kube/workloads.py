"""Deployment, StatefulSet, PodDisruptionBudget and NetworkPolicy.

Sources (kubernetes/kubernetes):
- pkg/apis/apps/validation/validation.go: ValidateDeployment, ValidateDeploymentSpec,
  ValidateDeploymentStrategy, ValidateRollingUpdateDeployment,
  ValidatePositiveIntOrPercent, IsNotMoreThan100Percent,
  ValidatePodTemplateSpecForReplicaSet (selector matches the template's labels;
  restartPolicy Always), ValidateStatefulSetSpec (podManagementPolicy, updateStrategy,
  a non-empty selector matching the template); after pkg/apis/apps/v1/defaults.go
  (SetDefaults_Deployment: strategy RollingUpdate 25 %/25 %; SetDefaults_StatefulSet:
  podManagementPolicy OrderedReady, updateStrategy RollingUpdate);
- pkg/apis/policy/validation/validation.go: ValidatePodDisruptionBudgetSpec;
- pkg/apis/networking/validation/validation.go: ValidateNetworkPolicy,
  ValidateNetworkPolicySpec, ValidateNetworkPolicyPort, ValidateNetworkPolicyPeer,
  ValidateIPBlock.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from . import pods
from .names import (
    Errors,
    is_dns1123_subdomain,
    is_valid_percent,
    is_valid_port_name,
    is_valid_port_num,
    label_selector,
    labels,
    object_meta,
)


def _int_or_percent(value: Any, path: str) -> Errors:
    """ValidatePositiveIntOrPercent + IsNotMoreThan100Percent."""
    if isinstance(value, str):
        errs = [f"{path}: Invalid value: {value!r}: {m}" for m in is_valid_percent(value)]
        if not errs and int(value[:-1]) > 100:
            errs.append(f"{path}: Invalid value: {value!r}: must not be greater than 100%")
        return errs
    if not isinstance(value, int) or value < 0:
        return [f"{path}: Invalid value: {value!r}: must be greater than or equal to 0"]
    return []


def _amount(value: Any) -> int:
    """getIntOrPercentValue."""
    return int(value[:-1]) if isinstance(value, str) and value.endswith("%") else int(value)


def _selector_matches(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    match_labels = selector.get("matchLabels") or {}
    if any(pod_labels.get(k) != v for k, v in match_labels.items()):
        return False
    for req in selector.get("matchExpressions") or []:
        present, value = req["key"] in pod_labels, pod_labels.get(req["key"])
        op, values = req["operator"], req.get("values") or []
        if (
            (op == "In" and value not in values)
            or (op == "NotIn" and present and value in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def _template(spec: dict[str, Any], kind: str) -> Errors:
    """The selector and ValidatePodTemplateSpecForReplicaSet / ...ForStatefulSet."""
    errs: Errors = []
    selector = spec.get("selector")
    template = spec.get("template") or {}
    meta = template.get("metadata") or {}
    if selector is None:
        errs.append("spec.selector: Required value")
    else:
        errs += label_selector(selector, "spec.selector")
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            errs.append(f"spec.selector: Invalid value: empty selector is invalid for {kind}")
        elif not _selector_matches(selector, meta.get("labels") or {}):
            errs.append(
                "spec.template.metadata.labels: Invalid value: `selector` does not "
                "match template `labels`"
            )
    errs += labels(meta.get("labels"), "spec.template.metadata.labels")
    pod_spec = template.get("spec") or {}
    errs += pods.pod_spec(pod_spec, "spec.template.spec")
    if pod_spec.get("restartPolicy", "Always") != "Always":
        errs.append("spec.template.spec.restartPolicy: Unsupported value: only 'Always'")
    return errs


def validate_deployment(doc: dict[str, Any]) -> Errors:
    """ValidateDeployment."""
    errs = object_meta(doc.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    spec = doc.get("spec") or {}
    errs += pods.non_negative(spec.get("replicas", 1), "spec.replicas")
    errs += _template(spec, "deployment")
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type", "RollingUpdate")
    if kind == "Recreate" and strategy.get("rollingUpdate") is not None:
        errs.append(
            "spec.strategy.rollingUpdate: Forbidden: may not be specified when "
            "strategy `type` is 'Recreate'"
        )
    elif kind == "RollingUpdate":
        rolling = strategy.get("rollingUpdate") or {}
        unavailable = rolling.get("maxUnavailable", "25%")
        surge = rolling.get("maxSurge", "25%")
        errs += _int_or_percent(unavailable, "spec.strategy.rollingUpdate.maxUnavailable")
        errs += _int_or_percent(surge, "spec.strategy.rollingUpdate.maxSurge")
        if not errs and _amount(unavailable) == 0 and _amount(surge) == 0:
            errs.append(
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: may not be "
                "0 when `maxSurge` is 0"
            )
    elif kind != "Recreate":
        errs.append(f"spec.strategy: Unsupported value: {kind!r}")
    errs += pods.non_negative(spec.get("minReadySeconds", 0), "spec.minReadySeconds")
    errs += pods.non_negative(spec.get("revisionHistoryLimit"), "spec.revisionHistoryLimit")
    deadline = spec.get("progressDeadlineSeconds")
    if deadline is not None and deadline <= spec.get("minReadySeconds", 0):
        errs.append(
            "spec.progressDeadlineSeconds: Invalid value: must be greater than minReadySeconds"
        )
    return errs


def validate_stateful_set(doc: dict[str, Any]) -> Errors:
    """ValidateStatefulSet."""
    errs = object_meta(doc.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    spec = doc.get("spec") or {}
    policy = spec.get("podManagementPolicy", "OrderedReady")
    if policy not in ("OrderedReady", "Parallel"):
        errs.append(
            f"spec.podManagementPolicy: Invalid value: {policy!r}: must be "
            "'OrderedReady' or 'Parallel'"
        )
    update = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
    if update not in ("RollingUpdate", "OnDelete"):
        errs.append(f"spec.updateStrategy: Invalid value: {update!r}")
    errs += pods.non_negative(spec.get("replicas", 1), "spec.replicas")
    errs += _template(spec, "statefulset")
    return errs


def validate_pdb(doc: dict[str, Any]) -> Errors:
    """ValidatePodDisruptionBudgetSpec (the object's metadata: a DNS-subdomain name)."""
    errs = object_meta(doc.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    spec = doc.get("spec") or {}
    if "minAvailable" in spec and "maxUnavailable" in spec:
        errs.append("spec: Invalid value: minAvailable and maxUnavailable cannot be both set")
    for key in ("minAvailable", "maxUnavailable"):
        if key in spec:
            errs += _int_or_percent(spec[key], f"spec.{key}")
    errs += label_selector(spec.get("selector"), "spec.selector")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("IfHealthyBudget", "AlwaysAllow"):
        errs.append(f"spec.unhealthyPodEvictionPolicy: Unsupported value: {policy!r}")
    return errs


def _policy_port(port: dict[str, Any], path: str) -> Errors:
    """ValidateNetworkPolicyPort."""
    errs: Errors = []
    if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
        errs.append(f"{path}.protocol: Unsupported value: {port.get('protocol')!r}")
    value = port.get("port")
    if isinstance(value, int):
        errs += [f"{path}.port: {m}" for m in is_valid_port_num(value)]
        end = port.get("endPort")
        if end is not None and end < value:
            errs.append(f"{path}.endPort: Invalid value: must be greater than or equal to `port`")
    elif value is not None:
        errs += [f"{path}.port: {value!r}: {m}" for m in is_valid_port_name(value)]
        if port.get("endPort") is not None:
            errs.append(
                f"{path}.endPort: Invalid value: may not be specified when `port` is non-numeric"
            )
    elif port.get("endPort") is not None:
        errs.append(
            f"{path}.endPort: Invalid value: may not be specified when `port` is not specified"
        )
    return errs


def _ip_block(block: dict[str, Any], path: str) -> Errors:
    """ValidateIPBlock: a valid CIDR (as a new object: no host bits), excepts strict subsets."""
    cidr = block.get("cidr", "")
    if not cidr:
        return [f"{path}.cidr: Required value"]
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        return [f"{path}.cidr: Invalid value: {cidr!r}: must be a valid CIDR value ({exc})"]
    errs: Errors = []
    for i, except_cidr in enumerate(block.get("except") or []):
        try:
            inner = ipaddress.ip_network(except_cidr, strict=True)
        except ValueError:
            errs.append(
                f"{path}.except[{i}]: Invalid value: {except_cidr!r}: must be a valid CIDR value"
            )
            continue
        if not (inner.subnet_of(network) and inner.prefixlen > network.prefixlen):  # type: ignore[arg-type]
            errs.append(
                f"{path}.except[{i}]: Invalid value: {except_cidr!r}: must be a strict "
                "subset of `cidr`"
            )
    return errs


def _peer(peer: dict[str, Any], path: str) -> Errors:
    """ValidateNetworkPolicyPeer."""
    errs: Errors = []
    kinds = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if k in peer]
    if not kinds:
        errs.append(f"{path}: Required value: must specify a peer")
    elif len(kinds) > 1 and "ipBlock" in kinds:
        errs.append(f"{path}: Forbidden: may not specify both ipBlock and another peer")
    for kind in ("podSelector", "namespaceSelector"):
        errs += label_selector(peer.get(kind), f"{path}.{kind}")
    if "ipBlock" in peer:
        errs += _ip_block(peer["ipBlock"], f"{path}.ipBlock")
    return errs


def validate_network_policy(doc: dict[str, Any]) -> Errors:
    """ValidateNetworkPolicy."""
    errs = object_meta(doc.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    spec = doc.get("spec") or {}
    errs += label_selector(spec.get("podSelector") or {}, "spec.podSelector")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(spec.get(direction) or []):
            where = f"spec.{direction}[{i}]"
            for j, port in enumerate(rule.get("ports") or []):
                errs += _policy_port(port, f"{where}.ports[{j}]")
            for j, peer in enumerate(rule.get(peers_key) or []):
                errs += _peer(peer, f"{where}.{peers_key}[{j}]")
    types = spec.get("policyTypes") or []
    if len(types) > 2:
        errs.append("spec.policyTypes: Invalid value: may not specify more than two policyTypes")
    for i, kind in enumerate(types):
        if kind not in ("Ingress", "Egress"):
            errs.append(f"spec.policyTypes[{i}]: Unsupported value: {kind!r}")
    return errs
