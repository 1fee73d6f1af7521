"""A pod template's spec, as kube-apiserver validates it for a Deployment or StatefulSet.

Source: kubernetes/kubernetes pkg/apis/core/validation/validation.go: ValidatePodSpec,
ValidateVolumes, validateVolumeSource, validateSecretVolumeSource,
validateConfigMapVolumeSource, validateKeyToPath, ValidateLocalNonReservedPath,
validateContainers, validateContainerCommon, validateContainerPorts, ValidateEnv,
validateEnvVarValueFrom, validateSecretKeySelector, ValidateVolumeMounts,
validateLivenessProbe/validateReadinessProbe, validateProbe, validateHandler,
validateHTTPGetAction, validateExecAction, ValidatePortNumOrName, validatePullPolicy,
validateResourceRequirements, validateTopologySpreadConstraints,
validatePodSpecSecurityContext, ValidateSecurityContext; applied after the defaults
of pkg/apis/core/v1/defaults.go (SetDefaults_PodSpec: restartPolicy Always,
terminationGracePeriodSeconds 30; SetDefaults_ContainerPort: protocol TCP;
SetDefaults_Probe; SetDefaults_HTTPGetAction: path "/", scheme HTTP;
SetDefaults_Container: imagePullPolicy), which the ``.get(..., default)`` calls mirror.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from .names import (
    Errors,
    is_config_map_key,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_env_var_name,
    is_qualified_name,
    is_valid_port_name,
    is_valid_port_num,
    label_selector,
    labels,
    port_num_or_name,
)

PROTOCOLS = {"TCP", "UDP", "SCTP"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
RESTART_POLICIES = {"Always", "OnFailure", "Never"}
SECCOMP_TYPES = {"RuntimeDefault", "Unconfined", "Localhost"}
WHEN_UNSATISFIABLE = {"DoNotSchedule", "ScheduleAnyway"}
HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc", "sleep")
VOLUME_SOURCES = ("emptyDir", "secret", "configMap", "projected", "downwardAPI", "hostPath",
                  "persistentVolumeClaim", "ephemeral", "csi", "image", "nfs")  # fmt: skip
MAX_ID = 0xFFFFFFFF  # validation.go: IsValidUserID / IsValidGroupID

_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
    "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def quantity(value: Any) -> Decimal | None:
    """apimachinery resource.ParseQuantity, enough for requests and limits; None: invalid."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value))
    if match is None:
        return None
    suffix = match.group("suffix")
    if suffix and suffix[0] in "eE":
        return Decimal(match.group("num")) * Decimal(10) ** int(suffix[1:])
    return Decimal(match.group("num")) * _SUFFIX[suffix]


def non_negative(value: Any, path: str) -> Errors:
    if value is not None and (not isinstance(value, int) or value < 0):
        return [f"{path}: Invalid value: {value!r}: must be greater than or equal to 0"]
    return []


def local_non_reserved_path(value: str, path: str) -> Errors:
    """ValidateLocalNonReservedPath: relative, no '..' element, not starting with '..'."""
    errs: Errors = []
    if value.startswith("/"):
        errs.append(f"{path}: Invalid value: {value!r}: must be a relative path")
    if ".." in value.split("/"):
        errs.append(f"{path}: Invalid value: {value!r}: must not contain '..'")
    if value.startswith(".."):
        errs.append(f"{path}: Invalid value: {value!r}: must not start with '..'")
    return errs


def _key_to_path(items: list[dict[str, Any]], path: str) -> Errors:
    errs: Errors = []
    for i, item in enumerate(items):
        where = f"{path}.items[{i}]"
        if not item.get("key"):
            errs.append(f"{where}.key: Required value")
        if not item.get("path"):
            errs.append(f"{where}.path: Required value")
        errs += local_non_reserved_path(item.get("path", ""), f"{where}.path")
        errs += _file_mode(item.get("mode"), f"{where}.mode")
    return errs


def _file_mode(mode: Any, path: str) -> Errors:
    if mode is not None and not (isinstance(mode, int) and 0 <= mode <= 0o777):
        return [f"{path}: Invalid value: {mode!r}: must be a number between 0 and 0777 (octal)"]
    return []


def volumes(vols: list[dict[str, Any]], path: str) -> tuple[set[str], Errors]:
    """ValidateVolumes + validateVolumeSource: returns the valid volume names, and errors."""
    names: set[str] = set()
    errs: Errors = []
    for i, vol in enumerate(vols):
        where = f"{path}[{i}]"
        el: Errors = []
        name = vol.get("name", "")
        if not name:
            el.append(f"{where}.name: Required value")
        else:
            el += [f"{where}.name: {name!r}: {m}" for m in is_dns1123_label(name)]
        if name in names:
            el.append(f"{where}.name: Duplicate value: {name!r}")
        sources = [s for s in VOLUME_SOURCES if s in vol]
        if not sources:
            el.append(f"{where}: Required value: must specify a volume type")
        elif len(sources) > 1:
            el.append(f"{where}.{sources[1]}: Forbidden: may not specify more than 1 volume type")
        if "secret" in vol:
            source = vol["secret"] or {}
            if not source.get("secretName"):
                el.append(f"{where}.secret.secretName: Required value")
            el += _file_mode(source.get("defaultMode"), f"{where}.secret.defaultMode")
            el += _key_to_path(source.get("items") or [], f"{where}.secret")
        if "configMap" in vol:
            source = vol["configMap"] or {}
            if not source.get("name"):
                el.append(f"{where}.configMap.name: Required value")
            el += _file_mode(source.get("defaultMode"), f"{where}.configMap.defaultMode")
            el += _key_to_path(source.get("items") or [], f"{where}.configMap")
        if "emptyDir" in vol:
            limit = (vol["emptyDir"] or {}).get("sizeLimit")
            parsed = quantity(limit) if limit is not None else Decimal(0)
            if parsed is None or parsed < 0:
                el.append(
                    f"{where}.emptyDir.sizeLimit: Forbidden: must be a valid resource quantity"
                )
        if el:
            errs += el
        else:
            names.add(name)
    return names, errs


def _ports(ports: list[dict[str, Any]], path: str) -> Errors:
    """validateContainerPorts."""
    errs: Errors = []
    seen: set[str] = set()
    for i, port in enumerate(ports):
        where = f"{path}[{i}]"
        name = port.get("name")
        if name:
            msgs = is_valid_port_name(name)
            errs += [f"{where}.name: {name!r}: {m}" for m in msgs]
            if not msgs and name in seen:
                errs.append(f"{where}.name: Duplicate value: {name!r}")
            seen.add(name)
        if not port.get("containerPort"):
            errs.append(f"{where}.containerPort: Required value")
        else:
            errs += [
                f"{where}.containerPort: {m}" for m in is_valid_port_num(port["containerPort"])
            ]
        if port.get("hostPort"):
            errs += [f"{where}.hostPort: {m}" for m in is_valid_port_num(port["hostPort"])]
        if port.get("protocol", "TCP") not in PROTOCOLS:
            errs.append(f"{where}.protocol: Unsupported value: {port.get('protocol')!r}")
    return errs


def _env(env: list[dict[str, Any]], path: str) -> Errors:
    """ValidateEnv + validateEnvVarValueFrom + validateSecretKeySelector."""
    errs: Errors = []
    for i, var in enumerate(env):
        where = f"{path}[{i}]"
        name = var.get("name", "")
        if not name:
            errs.append(f"{where}.name: Required value")
        else:
            errs += [f"{where}.name: {name!r}: {m}" for m in is_env_var_name(name)]
        value_from = var.get("valueFrom")
        if value_from is None:
            continue
        sources = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
                   if k in value_from]  # fmt: skip
        if not sources:
            errs.append(f"{where}.valueFrom: Invalid value: must specify one of the sources")
        elif var.get("value"):
            errs.append(f"{where}.valueFrom: Invalid value: may not be specified with `value`")
        elif len(sources) > 1:
            errs.append(f"{where}.valueFrom: Invalid value: more than one field specified")
        for kind in ("secretKeyRef", "configMapKeyRef"):
            ref = value_from.get(kind)
            if ref is None:
                continue
            errs += [
                f"{where}.valueFrom.{kind}.name: {m}"
                for m in is_dns1123_subdomain(ref.get("name", ""))
            ]
            if not ref.get("key"):
                errs.append(f"{where}.valueFrom.{kind}.key: Required value")
            else:
                errs += [
                    f"{where}.valueFrom.{kind}.key: {m}" for m in is_config_map_key(ref["key"])
                ]
    return errs


def _mounts(mounts: list[dict[str, Any]], volume_names: set[str], path: str) -> Errors:
    """ValidateVolumeMounts: the volume exists; mountPath given and unique; subPath local."""
    errs: Errors = []
    seen: set[str] = set()
    for i, mount in enumerate(mounts):
        where = f"{path}[{i}]"
        if not mount.get("name"):
            errs.append(f"{where}.name: Required value")
        if mount.get("name") not in volume_names:
            errs.append(f"{where}.name: Not found: {mount.get('name')!r}")
        mount_path = mount.get("mountPath", "")
        if not mount_path:
            errs.append(f"{where}.mountPath: Required value")
        if mount_path in seen:
            errs.append(f"{where}.mountPath: Invalid value: {mount_path!r}: must be unique")
        seen.add(mount_path)
        sub = mount.get("subPath")
        if sub and (sub.startswith("/") or ".." in sub.split("/")):
            errs.append(f"{where}.subPath: Invalid value: {sub!r}: must be a local descending path")
    return errs


def _handler(handler: dict[str, Any], path: str) -> Errors:
    """validateHandler: exactly one handler type, each valid."""
    kinds = [k for k in HANDLERS if k in handler]
    if not kinds:
        return [f"{path}: Required value: must specify a handler type"]
    if len(kinds) > 1:
        return [f"{path}.{kinds[1]}: Forbidden: may not specify more than 1 handler type"]
    kind, errs = kinds[0], []
    body = handler[kind] or {}
    if kind == "exec" and not body.get("command"):
        errs.append(f"{path}.exec.command: Required value")
    if kind == "httpGet":
        if not body.get("path", "/"):
            errs.append(f"{path}.httpGet.path: Required value")
        errs += [f"{path}.httpGet.port: {m}" for m in port_num_or_name(body.get("port"))]
        if body.get("scheme", "HTTP") not in ("HTTP", "HTTPS"):
            errs.append(f"{path}.httpGet.scheme: Unsupported value: {body.get('scheme')!r}")
    if kind == "tcpSocket":
        errs += [f"{path}.tcpSocket.port: {m}" for m in port_num_or_name(body.get("port"))]
    return errs


def _probe(probe: dict[str, Any] | None, path: str, *, liveness_or_startup: bool) -> Errors:
    """validateProbe, and validateLivenessProbe / validateReadinessProbe on top."""
    if probe is None:
        return []
    errs = _handler(probe, path)
    for key in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                "failureThreshold"):  # fmt: skip
        errs += non_negative(probe.get(key), f"{path}.{key}")
    if liveness_or_startup and probe.get("successThreshold", 1) != 1:
        errs.append(f"{path}.successThreshold: Invalid value: must be 1")
    if not liveness_or_startup and probe.get("terminationGracePeriodSeconds") is not None:
        errs.append(f"{path}.terminationGracePeriodSeconds: must not be set for readinessProbes")
    return errs


def _resources(resources: dict[str, Any], path: str) -> Errors:
    """validateResourceRequirements: quantities valid and non-negative; request <= limit."""
    errs: Errors = []
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for section, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            parsed = quantity(value)
            if parsed is None or parsed < 0:
                errs.append(
                    f"{path}.{section}[{name}]: Invalid value: {value!r}: must be a valid quantity"
                )
    for name, value in requests.items():
        request, limit = quantity(value), quantity(limits.get(name)) if name in limits else None
        if request is not None and limit is not None and request > limit:
            errs.append(
                f"{path}.requests: Invalid value: {value!r}: must be less than or equal to "
                f"{name} limit of {limits[name]}"
            )
    return errs


def _security_context(sc: dict[str, Any] | None, path: str) -> Errors:
    """ValidateSecurityContext (container): IDs in range; no privileged escalation mix."""
    if sc is None:
        return []
    errs = _ids(sc, path)
    if sc.get("privileged") is True and sc.get("allowPrivilegeEscalation") is False:
        errs.append(
            f"{path}: Invalid value: cannot set `allowPrivilegeEscalation` to false "
            "and `privileged` to true"
        )
    errs += _seccomp(sc.get("seccompProfile"), f"{path}.seccompProfile")
    return errs


def _ids(sc: dict[str, Any], path: str) -> Errors:
    errs: Errors = []
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        value = sc.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value <= MAX_ID):
            errs.append(f"{path}.{key}: Invalid value: {value!r}: must be between 0 and {MAX_ID}")
    return errs


def _seccomp(profile: dict[str, Any] | None, path: str) -> Errors:
    if profile is None:
        return []
    kind = profile.get("type")
    if kind not in SECCOMP_TYPES:
        return [f"{path}.type: Unsupported value: {kind!r}"]
    if (kind == "Localhost") != bool(profile.get("localhostProfile")):
        return [f"{path}.localhostProfile: must be set with type Localhost, and only then"]
    return []


def _topology_spread(constraints: list[dict[str, Any]], path: str) -> Errors:
    """validateTopologySpreadConstraints."""
    errs: Errors = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(constraints):
        where = f"{path}[{i}]"
        if not isinstance(c.get("maxSkew"), int) or c["maxSkew"] <= 0:
            errs.append(
                f"{where}.maxSkew: Invalid value: {c.get('maxSkew')!r}: must be greater than zero"
            )
        key = c.get("topologyKey", "")
        if not key:
            errs.append(f"{where}.topologyKey: Required value: can not be empty")
        else:
            errs += [f"{where}.topologyKey: {m}" for m in is_qualified_name(key)]
        if c.get("whenUnsatisfiable") not in WHEN_UNSATISFIABLE:
            errs.append(
                f"{where}.whenUnsatisfiable: Unsupported value: {c.get('whenUnsatisfiable')!r}"
            )
        if c.get("minDomains") is not None and c.get("whenUnsatisfiable") != "DoNotSchedule":
            errs.append(f"{where}.minDomains: Invalid value: only with DoNotSchedule")
        pair = (key, str(c.get("whenUnsatisfiable")))
        if pair in seen:
            errs.append(f"{where}: Duplicate value: {{{pair[0]}, {pair[1]}}}")
        seen.add(pair)
        errs += label_selector(c.get("labelSelector"), f"{where}.labelSelector")
    return errs


def _affinity(affinity: dict[str, Any] | None, path: str) -> Errors:
    """validateAffinity (pod anti-affinity terms): weight 1-100, topologyKey, selector."""
    errs: Errors = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = (affinity or {}).get(kind) or {}
        for i, weighted in enumerate(
            section.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ):
            where = f"{path}.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            if not 1 <= weighted.get("weight", 0) <= 100:
                errs.append(f"{where}.weight: Invalid value: must be in the range 1-100")
            term = weighted.get("podAffinityTerm") or {}
            if not term.get("topologyKey"):
                errs.append(f"{where}.podAffinityTerm.topologyKey: Required value")
            errs += label_selector(
                term.get("labelSelector"), f"{where}.podAffinityTerm.labelSelector"
            )
    return errs


def containers(spec: dict[str, Any], volume_names: set[str], path: str) -> Errors:
    """validateContainers + validateContainerCommon for each regular container."""
    errs: Errors = []
    ctrs = spec.get("containers") or []
    if not ctrs:
        return [f"{path}.containers: Required value"]
    seen: set[str] = set()
    for i, ctr in enumerate(ctrs):
        where = f"{path}.containers[{i}]"
        name = ctr.get("name", "")
        if not name:
            errs.append(f"{where}.name: Required value")
        else:
            errs += [f"{where}.name: {name!r}: {m}" for m in is_dns1123_label(name)]
        if name in seen:
            errs.append(f"{where}.name: Duplicate value: {name!r}")
        seen.add(name)
        if not ctr.get("image"):
            errs.append(f"{where}.image: Required value")
        errs += _ports(ctr.get("ports") or [], f"{where}.ports")
        errs += _env(ctr.get("env") or [], f"{where}.env")
        errs += _mounts(ctr.get("volumeMounts") or [], volume_names, f"{where}.volumeMounts")
        if ctr.get("imagePullPolicy", "IfNotPresent") not in PULL_POLICIES:
            errs.append(
                f"{where}.imagePullPolicy: Unsupported value: {ctr.get('imagePullPolicy')!r}"
            )
        errs += _resources(ctr.get("resources") or {}, f"{where}.resources")
        errs += _security_context(ctr.get("securityContext"), f"{where}.securityContext")
        errs += _probe(ctr.get("livenessProbe"), f"{where}.livenessProbe", liveness_or_startup=True)
        errs += _probe(ctr.get("startupProbe"), f"{where}.startupProbe", liveness_or_startup=True)
        errs += _probe(
            ctr.get("readinessProbe"), f"{where}.readinessProbe", liveness_or_startup=False
        )
        lifecycle = ctr.get("lifecycle") or {}
        for hook in ("postStart", "preStop"):
            if hook in lifecycle:
                errs += _handler(lifecycle[hook], f"{where}.lifecycle.{hook}")
    return errs


def pod_spec(spec: dict[str, Any], path: str) -> Errors:
    """ValidatePodSpec, for the parts a pod template of ours can hold."""
    volume_names, errs = volumes(spec.get("volumes") or [], f"{path}.volumes")
    errs += containers(spec, volume_names, path)
    errs += non_negative(
        spec.get("terminationGracePeriodSeconds", 30), f"{path}.terminationGracePeriodSeconds"
    )
    if spec.get("restartPolicy", "Always") not in RESTART_POLICIES:
        errs.append(f"{path}.restartPolicy: Unsupported value: {spec.get('restartPolicy')!r}")
    errs += labels(spec.get("nodeSelector"), f"{path}.nodeSelector")
    pod_sc = spec.get("securityContext") or {}
    errs += _ids(pod_sc, f"{path}.securityContext")
    errs += _seccomp(pod_sc.get("seccompProfile"), f"{path}.securityContext.seccompProfile")
    errs += _affinity(spec.get("affinity"), f"{path}.affinity")
    errs += _topology_spread(
        spec.get("topologySpreadConstraints") or [], f"{path}.topologySpreadConstraints"
    )
    for key in ("serviceAccountName", "priorityClassName"):
        if spec.get(key):
            errs += [f"{path}.{key}: {spec[key]!r}: {m}" for m in is_dns1123_subdomain(spec[key])]
    return errs
