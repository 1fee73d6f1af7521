"""A webhook kubeconfig as kube-apiserver loads it (--authentication-token-webhook-config-file,
--authorization-webhook-config-file, connectionInfo.kubeConfigFile).

Source: kubernetes/kubernetes staging/src/k8s.io/client-go/tools/clientcmd: the webhook
client (k8s.io/apiserver/pkg/util/webhook, LoadKubeconfig) reads the file with
clientcmd's loading rules and takes its current context; validation.go's ConfirmUsable
checks that context: ErrNoContext without one, errContextNotFound, then validateContext
(the user and cluster it names exist), validateAuthInfo (a client certificate needs its
key; one of token and basic auth at most) and validateClusterInfo (a server; the CA file
readable). The files kube opens (os.Open) are on the control-plane node: the caller says
which absolute paths are installed there (``readable``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .names import Errors


def load_kubeconfig(doc: Any) -> dict[str, Any]:
    """The v1 Config's named lists as clientcmd's maps: clusters, users (AuthInfos) and
    contexts by name, and the current context."""
    if not isinstance(doc, dict) or doc.get("kind") != "Config" or doc.get("apiVersion") != "v1":
        raise ValueError("not a v1 Config (kind: Config, apiVersion: v1)")

    def named(key: str, inner: str) -> dict[str, dict[str, Any]]:
        return {item["name"]: dict(item.get(inner) or {}) for item in doc.get(key) or []}

    return {
        "clusters": named("clusters", "cluster"),
        "users": named("users", "user"),
        "contexts": named("contexts", "context"),
        "current-context": doc.get("current-context", ""),
    }


def confirm_usable(config: dict[str, Any], readable: Callable[[str], bool]) -> Errors:
    """ConfirmUsable for the current context; [] when kube-apiserver can use the file."""
    if not (config["clusters"] or config["users"] or config["contexts"]):
        return ["invalid configuration: no configuration has been provided"]
    name = config["current-context"]
    if not name:
        return ["no context chosen"]
    context = config["contexts"].get(name)
    if context is None:
        return [f"context was not found for specified context: {name}"]
    errs: Errors = []
    user_name, cluster_name = context.get("user", ""), context.get("cluster", "")
    if not user_name:
        errs.append(f'user was not specified for context "{name}"')
    elif user_name not in config["users"]:
        errs.append(f'user "{user_name}" was not found for context "{name}"')
    if not cluster_name:
        errs.append(f'cluster was not specified for context "{name}"')
    elif cluster_name not in config["clusters"]:
        errs.append(f'cluster "{cluster_name}" was not found for context "{name}"')
    errs += _auth_info(user_name, config["users"].get(user_name, {}), readable)
    errs += _cluster_info(cluster_name, config["clusters"].get(cluster_name, {}), readable)
    return errs


def _auth_info(name: str, user: dict[str, Any], readable: Callable[[str], bool]) -> Errors:
    errs: Errors = []
    methods = ["token"] if user.get("token") else []
    if user.get("username") or user.get("password"):
        methods.append("basicAuth")
    cert, cert_data = user.get("client-certificate"), user.get("client-certificate-data")
    key, key_data = user.get("client-key"), user.get("client-key-data")
    if cert or cert_data:
        if cert and cert_data:
            errs.append(f"client-cert-data and client-cert are both specified for {name}. "
                        "client-cert-data will override.")  # fmt: skip
        if key and key_data:
            errs.append(f"client-key-data and client-key are both specified for {name}; "
                        "client-key-data will override")  # fmt: skip
        if not key and not key_data:
            errs.append(f"client-key-data or client-key must be specified for {name} to use "
                        "the clientCert authentication method.")  # fmt: skip
        for kind, path in (("client-cert", cert), ("client-key", key)):
            if path and not readable(path):
                errs.append(f"unable to read {kind} {path} for {name} due to open {path}: "
                            "no such file or directory")  # fmt: skip
    if len(methods) > 1:
        errs.append(f"more than one authentication method found for {name}; found "
                    f"[{' '.join(methods)}], only one is allowed")  # fmt: skip
    return errs


def _cluster_info(name: str, cluster: dict[str, Any], readable: Callable[[str], bool]) -> Errors:
    if not cluster:
        return ["cluster has no server defined"]
    errs: Errors = []
    if not cluster.get("server"):
        errs.append(f'no server found for cluster "{name}"')
    ca, ca_data = cluster.get("certificate-authority"), cluster.get("certificate-authority-data")
    if ca and ca_data:
        errs.append(f"certificate-authority-data and certificate-authority are both specified "
                    f"for {name}. certificate-authority-data will override.")  # fmt: skip
    if ca and not readable(ca):
        errs.append(f"unable to read certificate-authority {ca} for {name} due to open {ca}: "
                    "no such file or directory")  # fmt: skip
    return errs
