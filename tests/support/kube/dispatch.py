"""Which validation kube-apiserver runs for each kind deploy/ ships."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from . import admission, core, podsecurity, workloads
from .names import Errors

Validator = Callable[[dict[str, Any]], Errors]

#: (apiVersion, kind) -> the validation kube-apiserver applies on create.
VALIDATORS: dict[tuple[str, str], Validator] = {
    ("v1", "Namespace"): core.validate_namespace,
    ("v1", "ServiceAccount"): core.validate_service_account,
    ("v1", "ConfigMap"): core.validate_config_map,
    ("v1", "Secret"): core.validate_secret,
    ("v1", "Service"): core.validate_service,
    ("apps/v1", "Deployment"): workloads.validate_deployment,
    ("apps/v1", "StatefulSet"): workloads.validate_stateful_set,
    ("policy/v1", "PodDisruptionBudget"): workloads.validate_pdb,
    ("networking.k8s.io/v1", "NetworkPolicy"): workloads.validate_network_policy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): admission.validate_policy,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): admission.validate_binding,
}

#: Kinds served by CRDs: validated against their CRD's OpenAPI schema by the apiserver,
#: which only the operator that installs the CRD ships; checked elsewhere
#: (tests/{deploy,process}/test_prometheus.py runs promtool on the rules).
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
}


def validate(doc: dict[str, Any], *, restricted_namespaces: Collection[str] = ()) -> Errors:
    """kube-apiserver's validation errors for ``doc`` ([] when it would be admitted).

    A Deployment or StatefulSet in one of ``restricted_namespaces`` (namespaces whose
    ``pod-security.kubernetes.io/enforce`` label is "restricted") must also have pods
    that level admits."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in CUSTOM_RESOURCES:
        return []
    validator = VALIDATORS.get(key)
    if validator is None:
        return [f"{key}: no validation encoded for this kind; add it to tests/support/kube"]
    errs = validator(doc)
    if key in (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")):
        namespace = (doc.get("metadata") or {}).get("namespace")
        if namespace in restricted_namespaces:
            errs += podsecurity.restricted(doc["spec"]["template"].get("spec") or {})
    return errs
