"""Pod Security Admission's "restricted" level, for pods created in a namespace that
enforces it (deploy/base/namespace.yaml). A pod that fails it is refused when its
ReplicaSet or StatefulSet creates it, long after ``kubectl apply`` said "configured".

Source: kubernetes/kubernetes staging/src/k8s.io/pod-security-admission/policy/
(baseline and restricted checks, latest version): check_privileged.go,
check_hostNamespaces.go, check_hostPorts.go, check_hostPathVolumes.go,
check_restrictedVolumes.go, check_allowPrivilegeEscalation.go,
check_runAsNonRoot.go, check_runAsUser.go, check_seccompProfile_restricted.go,
check_capabilities_restricted.go, check_procMount.go, check_sysctls.go.
"""

from __future__ import annotations

from typing import Any

from .names import Errors

#: check_restrictedVolumes.go: the only volume types the restricted level allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip
#: check_capabilities_restricted.go: all dropped; only this one may be added back.
ADDABLE_CAPABILITY = "NET_BIND_SERVICE"


def restricted(spec: dict[str, Any], path: str = "spec.template.spec") -> Errors:
    """The restricted level's violations for a pod spec ([] when it is admitted)."""
    errs: Errors = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            errs.append(f"{path}.{key}: host namespaces (check_hostNamespaces)")
    for i, vol in enumerate(spec.get("volumes") or []):
        kinds = set(vol) - {"name"}
        if "hostPath" in kinds:
            errs.append(f"{path}.volumes[{i}]: hostPath volumes (check_hostPathVolumes)")
        if kinds - RESTRICTED_VOLUMES:
            errs.append(
                f"{path}.volumes[{i}]: restricted volume types {sorted(kinds)} "
                "(check_restrictedVolumes)"
            )
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        errs.append(f"{path}.securityContext.seccompProfile: {pod_seccomp} (check_seccompProfile)")
    if pod_sc.get("runAsUser") == 0:
        errs.append(f"{path}.securityContext.runAsUser: 0 (check_runAsUser)")
    for kind in ("initContainers", "containers"):
        for i, ctr in enumerate(spec.get(kind) or []):
            errs += _container(ctr, pod_sc, f"{path}.{kind}[{i}]")
    return errs


def _container(ctr: dict[str, Any], pod_sc: dict[str, Any], path: str) -> Errors:
    errs: Errors = []
    sc = ctr.get("securityContext") or {}
    if sc.get("privileged"):
        errs.append(f"{path}.securityContext.privileged: true (check_privileged)")
    if any(port.get("hostPort") for port in ctr.get("ports") or []):
        errs.append(f"{path}.ports: hostPort (check_hostPorts)")
    if sc.get("allowPrivilegeEscalation") is not False:
        errs.append(
            f"{path}.securityContext.allowPrivilegeEscalation: must be false "
            "(check_allowPrivilegeEscalation)"
        )
    # check_runAsNonRoot: the container's own setting wins; else the pod's must be true.
    run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if run_as_non_root is not True:
        errs.append(f"{path}.securityContext.runAsNonRoot: must be true (check_runAsNonRoot)")
    if sc.get("runAsUser") == 0:
        errs.append(f"{path}.securityContext.runAsUser: 0 (check_runAsUser)")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        errs.append(
            f"{path}.securityContext.seccompProfile: must be RuntimeDefault or "
            "Localhost (check_seccompProfile)"
        )
    capabilities = sc.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        errs.append(
            f"{path}.securityContext.capabilities.drop: must include ALL (check_capabilities)"
        )
    extra = set(capabilities.get("add") or []) - {ADDABLE_CAPABILITY}
    if extra:
        errs.append(
            f"{path}.securityContext.capabilities.add: {sorted(extra)} (check_capabilities)"
        )
    if sc.get("procMount", "Default") != "Default":
        errs.append(f"{path}.securityContext.procMount: must be Default (check_procMount)")
    return errs
