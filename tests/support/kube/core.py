"""Core objects other than pods: Namespace, ServiceAccount, ConfigMap, Secret, Service.

Source: kubernetes/kubernetes pkg/apis/core/validation/validation.go: ValidateNamespace,
ValidateServiceAccount, ValidateConfigMap, ValidateSecret (MaxSecretSize, the
kubernetes.io/tls keys), ValidateService, validateServicePort,
ValidateServiceClusterIPsRelatedFields, validateServiceExternalTrafficPolicy (the
load balancer's source ranges, in ValidateService); after pkg/apis/core/v1/defaults.go
(SetDefaults_Service: type ClusterIP, sessionAffinity None, port protocol TCP,
targetPort = port). The ClusterIP allocator's range check is not validation but
registry code: pkg/registry/core/service/ipallocator/bitmap.go (Allocate refuses "the
provided IP (...) is not in the valid range"; for IPv4 the network and broadcast
addresses are never allocated) — see :func:`allocatable_cluster_ip`.
Pod Security Admission's namespace labels: staging/src/k8s.io/pod-security-admission/
api/helpers.go (ParseLevel, ParseVersion), checked by admission.go ValidateNamespace.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from typing import Any

from .names import (
    Errors,
    is_config_map_key,
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_ip,
    is_valid_port_num,
    labels,
    object_meta,
    port_num_or_name,
)

#: core.MaxSecretSize: ConfigMaps and Secrets alike.
MAX_SECRET_SIZE = 1024 * 1024
SERVICE_TYPES = {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}
PSA_LEVELS = {"privileged", "baseline", "restricted"}
_PSA_VERSION = re.compile(r"^(latest|v1\.(0|[1-9][0-9]*))$")


def validate_namespace(ns: dict[str, Any]) -> Errors:
    """ValidateNamespace (a DNS-1123 label), plus Pod Security Admission's own labels."""
    errs = object_meta(ns.get("metadata"), namespaced=False, name_check=is_dns1123_label)
    for key, value in ((ns.get("metadata") or {}).get("labels") or {}).items():
        if not key.startswith("pod-security.kubernetes.io/"):
            continue
        mode = key.split("/", 1)[1]
        if mode in ("enforce", "audit", "warn") and value not in PSA_LEVELS:
            errs.append(
                f"metadata.labels[{key}]: Invalid value: {value!r}: must be one of "
                f"{sorted(PSA_LEVELS)}"
            )
        if mode.endswith("-version") and not _PSA_VERSION.match(value):
            errs.append(
                f"metadata.labels[{key}]: Invalid value: {value!r}: must be 'latest' or v1.x"
            )
    return errs


def validate_service_account(sa: dict[str, Any]) -> Errors:
    """ValidateServiceAccount: ObjectMeta with a DNS-subdomain name."""
    return object_meta(sa.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)


def _data_size(values: dict[str, Any], path: str) -> tuple[int, Errors]:
    errs: Errors = []
    total = 0
    for key, value in values.items():
        errs += [f"{path}[{key}]: Invalid value: {key!r}: {m}" for m in is_config_map_key(key)]
        total += len(value.encode() if isinstance(value, str) else value)
    return total, errs


def validate_config_map(cm: dict[str, Any]) -> Errors:
    """ValidateConfigMap: keys are config keys, not in both bags; 1 MiB in all."""
    errs = object_meta(cm.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
    size, more = _data_size(data, "data")
    errs += more
    binary_bytes = {k: base64.b64decode(v) for k, v in binary.items()}
    binary_size, more = _data_size(binary_bytes, "binaryData")
    errs += more
    errs += [
        f"data[{k}]: Invalid value: duplicate of key present in binaryData"
        for k in set(data) & set(binary)
    ]
    if size + binary_size > MAX_SECRET_SIZE:
        errs.append(f"<object>: Too long: may not be more than {MAX_SECRET_SIZE} bytes")
    return errs


def validate_secret(secret: dict[str, Any]) -> Errors:
    """ValidateSecret, after stringData is merged into data (as the apiserver converts it)."""
    errs = object_meta(secret.get("metadata"), namespaced=True, name_check=is_dns1123_subdomain)
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    size, more = _data_size(data, "data")
    errs += more
    if size > MAX_SECRET_SIZE:
        errs.append(f"data: Too long: may not be more than {MAX_SECRET_SIZE} bytes")
    if secret.get("type") == "kubernetes.io/tls":
        errs += [
            f"data[{key}]: Required value" for key in ("tls.crt", "tls.key") if key not in data
        ]
    return errs


def _service_port(port: dict[str, Any], require_name: bool, seen: set[str], path: str) -> Errors:
    """validateServicePort."""
    errs: Errors = []
    name = port.get("name", "")
    if require_name and not name:
        errs.append(f"{path}.name: Required value")
    elif name:
        errs += [f"{path}.name: {name!r}: {m}" for m in is_dns1123_label(name)]
        if name in seen:
            errs.append(f"{path}.name: Duplicate value: {name!r}")
        seen.add(name)
    errs += [f"{path}.port: {m}" for m in is_valid_port_num(port.get("port"))]
    if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
        errs.append(f"{path}.protocol: Unsupported value: {port.get('protocol')!r}")
    # SetDefaults_Service: targetPort defaults to port.
    errs += [
        f"{path}.targetPort: {m}"
        for m in port_num_or_name(port.get("targetPort", port.get("port")))
    ]
    if port.get("appProtocol") is not None:
        errs += [f"{path}.appProtocol: {m}" for m in is_qualified_name(port["appProtocol"])]
    return errs


def validate_service(svc: dict[str, Any]) -> Errors:
    """ValidateService (the fields a ClusterIP or headless Service of ours can hold)."""
    errs = object_meta(svc.get("metadata"), namespaced=True, name_check=is_dns1035_label)
    spec = svc.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    cluster_ip = spec.get("clusterIP")
    headless = cluster_ip == "None"
    ports = spec.get("ports") or []
    if not ports and not headless and kind != "ExternalName":
        errs.append("spec.ports: Required value")
    seen: set[str] = set()
    keys: set[tuple[str, Any]] = set()
    for i, port in enumerate(ports):
        errs += _service_port(port, len(ports) > 1, seen, f"spec.ports[{i}]")
        key = (port.get("protocol", "TCP"), port.get("port"))
        if key in keys:
            errs.append(f"spec.ports[{i}]: Duplicate value: {key}")
        keys.add(key)
        if kind == "ClusterIP" and port.get("nodePort"):
            errs.append(
                f"spec.ports[{i}].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
            )
    errs += labels(spec.get("selector"), "spec.selector")
    if spec.get("sessionAffinity", "None") not in ("None", "ClientIP"):
        errs.append(f"spec.sessionAffinity: Unsupported value: {spec.get('sessionAffinity')!r}")
    if kind not in SERVICE_TYPES:
        errs.append(f"spec.type: Unsupported value: {kind!r}")
    # ValidateServiceClusterIPsRelatedFields: each of clusterIPs is an IP or "None", and
    # clusterIPs[0] is clusterIP.
    cluster_ips = spec.get("clusterIPs") or ([cluster_ip] if cluster_ip else [])
    if cluster_ip and cluster_ips[0] != cluster_ip:
        errs.append("spec.clusterIPs[0]: Invalid value: must match `clusterIP`")
    for i, ip in enumerate(cluster_ips):
        if ip != "None":
            errs += [f"spec.clusterIPs[{i}]: Invalid value: {ip!r}: {m}" for m in is_valid_ip(ip)]
    if headless and kind in ("NodePort", "LoadBalancer"):
        errs.append(f"spec.clusterIPs[0]: Invalid value: may not be 'None' for {kind} services")
    if spec.get("internalTrafficPolicy", "Cluster") not in ("Cluster", "Local"):
        errs.append(
            f"spec.internalTrafficPolicy: Unsupported value: {spec.get('internalTrafficPolicy')!r}"
        )
    return errs + _external_fields(spec, kind)


def _external_fields(spec: dict[str, Any], kind: str) -> Errors:
    """validateServiceExternalTrafficPolicy (after SetDefaults_Service, which sets
    Cluster on a NodePort or LoadBalancer Service), and ValidateService's
    loadBalancerSourceRanges block (IsValidCIDR on each, space-padding allowed)."""
    errs: Errors = []
    externally_accessible = kind in ("NodePort", "LoadBalancer") or bool(spec.get("externalIPs"))
    policy = spec.get("externalTrafficPolicy")
    if not externally_accessible:
        if policy:
            errs.append(
                f"spec.externalTrafficPolicy: Invalid value: {policy!r}: may only be set for "
                "externally-accessible services"
            )
    elif (policy or "Cluster") not in ("Cluster", "Local"):
        errs.append(
            f"spec.externalTrafficPolicy: Unsupported value: {policy!r}: supported values: "
            '"Cluster", "Local"'
        )
    ranges = spec.get("loadBalancerSourceRanges") or []
    if ranges and kind != "LoadBalancer":
        errs.append(
            "spec.loadBalancerSourceRanges: Forbidden: may only be used when `type` is "
            "'LoadBalancer'"
        )
    for i, value in enumerate(ranges):
        try:
            ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            errs.append(
                f"spec.loadBalancerSourceRanges[{i}]: Invalid value: {value!r}: must be a valid "
                "CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
            )
    return errs


def allocatable_cluster_ip(ip: str, service_cidr: str) -> Errors:
    """Whether kube-apiserver's ClusterIP allocator accepts ``ip`` for a cluster whose
    --service-cluster-ip-range is ``service_cidr`` (ipallocator/bitmap.go: Allocate)."""
    network = ipaddress.ip_network(service_cidr)
    address = ipaddress.ip_address(ip)
    in_range = address in network and (
        network.version == 6 or address not in (network.network_address, network.broadcast_address)
    )
    if in_range and address == network.network_address + 1:
        # controlplane: the first address of the range is the `kubernetes` Service's.
        return [
            f'spec.clusterIPs: Invalid value: []string{{"{ip}"}}: failed to allocate IP {ip}: '
            "provided IP is already allocated"
        ]
    if not in_range:
        return [
            f'spec.clusterIPs: Invalid value: []string{{"{ip}"}}: failed to allocate IP {ip}: '
            f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is "
            f"{service_cidr}"
        ]
    return []


def static_band(service_cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """The lower band of the service range that dynamic ClusterIP allocation avoids
    (ServiceIPStaticSubrange, GA in 1.26): ipallocator/bitmap.go calculateRangeOffset,
    min(max(16, size/16), 256) addresses from the start of the range. A fixed ClusterIP
    picked there cannot collide with one handed out to another Service."""
    network = ipaddress.ip_network(service_cidr)
    size = network.num_addresses
    offset = 0 if size <= 16 else min(max(16, size // 16), 256)
    return ipaddress.ip_network(
        f"{network.network_address}/{network.max_prefixlen - (offset.bit_length() - 1)}"
    )
