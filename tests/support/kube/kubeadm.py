"""kubeadm's side of kube-apiserver: the command it writes into the static pod from a
ClusterConfiguration, and the patches it applies to that pod (``--patches``).

Sources (kubernetes/kubernetes):
- cmd/kubeadm/app/phases/controlplane/manifests.go, getAPIServerCommand: the default
  flags (below, for a local etcd), ``--authorization-mode=Node,RBAC`` unless
  ``apiServer.extraArgs`` names ``authorization-config`` (since kubeadm 1.30,
  kubernetes/kubernetes#123654: kube-apiserver refuses both), a user's
  ``authorization-mode`` taking its place (getAuthzModes, its valid modes only);
- cmd/kubeadm/app/util/arguments.go, ArgumentsToCommand: an extraArg replaces every
  default of its name, and the flags are sorted by name, then value (so kubeadm's own
  ``--authorization-mode`` is the third flag, after ``--advertise-address`` and
  ``--allow-privileged``, unless an extraArg sorts before it);
- cmd/kubeadm/app/util/patches: a ``<target>+json.yaml`` file is an RFC 6902 JSON patch,
  applied with evanphx/json-patch: a ``test`` that fails fails the patch, and kubeadm
  writes nothing for the component.
"""

from __future__ import annotations

import copy
from typing import Any

PKI = "/etc/kubernetes/pki"

#: getAPIServerCommand's defaults, as kubeadm init writes them for a local etcd.
DEFAULTS = (
    ("advertise-address", "192.168.0.10"),
    ("allow-privileged", "true"),
    ("client-ca-file", f"{PKI}/ca.crt"),
    ("enable-admission-plugins", "NodeRestriction"),
    ("enable-bootstrap-token-auth", "true"),
    ("etcd-cafile", f"{PKI}/etcd/ca.crt"),
    ("etcd-certfile", f"{PKI}/apiserver-etcd-client.crt"),
    ("etcd-keyfile", f"{PKI}/apiserver-etcd-client.key"),
    ("etcd-servers", "https://127.0.0.1:2379"),
    ("kubelet-client-certificate", f"{PKI}/apiserver-kubelet-client.crt"),
    ("kubelet-client-key", f"{PKI}/apiserver-kubelet-client.key"),
    ("kubelet-preferred-address-types", "InternalIP,ExternalIP,Hostname"),
    ("proxy-client-cert-file", f"{PKI}/front-proxy-client.crt"),
    ("proxy-client-key-file", f"{PKI}/front-proxy-client.key"),
    ("requestheader-allowed-names", "front-proxy-client"),
    ("requestheader-client-ca-file", f"{PKI}/front-proxy-ca.crt"),
    ("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
    ("requestheader-group-headers", "X-Remote-Group"),
    ("requestheader-username-headers", "X-Remote-User"),
    ("secure-port", "6443"),
    ("service-account-issuer", "https://kubernetes.default.svc.cluster.local"),
    ("service-account-key-file", f"{PKI}/sa.pub"),
    ("service-account-signing-key-file", f"{PKI}/sa.key"),
    ("service-cluster-ip-range", "10.96.0.0/12"),
    ("tls-cert-file", f"{PKI}/apiserver.crt"),
    ("tls-private-key-file", f"{PKI}/apiserver.key"),
)
DEFAULT_MODES = ("Node", "RBAC")
VALID_MODES = ("Node", "RBAC", "Webhook", "ABAC", "AlwaysAllow", "AlwaysDeny")


def apiserver_command(extra_args: list[dict[str, str]]) -> list[str]:
    """The static pod's kube-apiserver command for ``apiServer.extraArgs`` (v1beta4's
    list of ``{name, value}``)."""
    base = list(DEFAULTS)
    names = {arg["name"] for arg in extra_args}
    if "authorization-config" not in names:
        requested = next((a["value"] for a in extra_args if a["name"] == "authorization-mode"), "")
        modes = [m for m in requested.split(",") if m in VALID_MODES] or list(DEFAULT_MODES)
        base.append(("authorization-mode", ",".join(modes)))
    args = [(a["name"], a["value"]) for a in extra_args]
    args += [(name, value) for name, value in base if name not in names]
    return ["kube-apiserver", *(f"--{name}={value}" for name, value in sorted(args))]


def static_pod(extra_args: list[dict[str, str]]) -> dict[str, Any]:
    """kube-apiserver's static pod as kubeadm writes it (the parts a patch touches)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
        "spec": {
            "containers": [
                {
                    "name": "kube-apiserver",
                    "command": apiserver_command(extra_args),
                    "volumeMounts": [{"name": "k8s-certs", "mountPath": PKI, "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "k8s-certs", "hostPath": {"path": PKI, "type": "DirectoryOrCreate"}}
            ],
        },
    }


class PatchFailed(ValueError):
    """A JSON patch kubeadm would refuse to apply (the component is not written)."""


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902's add, replace, remove and test on a copy of ``doc``; a failed test or a
    path that is not there raises :class:`PatchFailed`, as evanphx/json-patch does."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        kind = op["op"]
        if isinstance(target, list):
            if kind == "add" and last == "-":
                target.append(op["value"])
                continue
            index = int(last)
            if not 0 <= index < len(target) + (kind == "add"):
                raise PatchFailed(f"{kind} {op['path']}: no such index")
            if kind == "add":
                target.insert(index, op["value"])
            elif kind == "replace":
                target[index] = op["value"]
            elif kind == "remove":
                del target[index]
            elif kind == "test":
                if target[index] != op["value"]:
                    raise PatchFailed(f"testing value {op['path']} failed: {target[index]!r}")
            else:
                raise PatchFailed(f"unsupported op {kind}")
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in target:
                raise PatchFailed(f"replace {op['path']}: no such key")
            target[last] = op["value"]
        elif kind == "remove":
            del target[last]
        elif kind == "test":
            if target.get(last) != op["value"]:
                raise PatchFailed(f"testing value {op['path']} failed")
        else:
            raise PatchFailed(f"unsupported op {kind}")
    return doc
