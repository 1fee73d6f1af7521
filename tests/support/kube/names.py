"""Name, label and metadata formats, as apimachinery checks them.

Sources (kubernetes/kubernetes):
- staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go: IsDNS1123Label,
  IsDNS1123Subdomain, IsDNS1035Label, IsValidPortName, IsValidPortNum, IsEnvVarName,
  IsConfigMapKey, IsValidPercent, IsValidIP;
- staging/src/k8s.io/apimachinery/pkg/api/validate/content/kube.go: IsLabelKey
  (IsQualifiedName), IsLabelValue;
- staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go: ValidateObjectMeta,
  ValidateAnnotations (TotalAnnotationSizeLimitB);
- staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go:
  ValidateLabels, ValidateLabelSelector.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

Errors = list[str]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME_CHARSET = re.compile(r"^[-a-z0-9]+$")
_ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_PERCENT = re.compile(r"^[0-9]+%$")

#: objectmeta.go: TotalAnnotationSizeLimitB
ANNOTATIONS_MAX_BYTES = 256 * 1024


def is_dns1123_label(value: str) -> Errors:
    """validation.go: IsDNS1123Label."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _DNS1123_LABEL.match(value):
        errs.append("a lowercase RFC 1123 label must consist of [a-z0-9] or '-'")
    return errs


def is_dns1123_subdomain(value: str) -> Errors:
    """validation.go: IsDNS1123Subdomain."""
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errs.append("a lowercase RFC 1123 subdomain must consist of [a-z0-9], '-' or '.'")
    return errs


def is_dns1035_label(value: str) -> Errors:
    """validation.go: IsDNS1035Label (Service names: ValidateServiceName)."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _DNS1035_LABEL.match(value):
        errs.append("a DNS-1035 label must consist of [a-z0-9] or '-', start with a letter")
    return errs


def is_qualified_name(value: str) -> Errors:
    """content/kube.go: IsLabelKey (IsQualifiedName): an optional DNS-subdomain prefix and '/'."""
    parts = value.split("/")
    if len(parts) > 2:
        return ["a valid label key is a name with an optional DNS subdomain prefix and '/'"]
    errs = []
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errs.append("prefix part must be non-empty")
        else:
            errs += [f"prefix part {m}" for m in is_dns1123_subdomain(parts[0])]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _LABEL_KEY_NAME.match(name):
        errs.append("name part must consist of alphanumeric characters, '-', '_' or '.'")
    return errs


def is_label_value(value: str) -> Errors:
    """content/kube.go: IsLabelValue."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errs.append("a valid label must be empty or consist of alphanumerics, '-', '_' or '.'")
    return errs


def is_valid_port_num(port: Any) -> Errors:
    """validation.go: IsValidPortNum."""
    if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        return []
    return ["must be between 1 and 65535, inclusive"]


def is_valid_port_name(port: str) -> Errors:
    """validation.go: IsValidPortName (IANA_SVC_NAME)."""
    errs = []
    if len(port) > 15:
        errs.append("must be no more than 15 characters")
    if not _PORT_NAME_CHARSET.match(port):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", port):
        errs.append("must contain at least one letter (a-z)")
    if "--" in port:
        errs.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def port_num_or_name(port: Any) -> Errors:
    """core/validation.go: ValidatePortNumOrName (an IntOrString)."""
    return is_valid_port_num(port) if isinstance(port, int) else is_valid_port_name(str(port))


def _no_chdir_prefix(value: str) -> Errors:
    """validation.go: hasChDirPrefix."""
    if value in (".", ".."):
        return [f"must not be '{value}'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_env_var_name(value: str) -> Errors:
    """validation.go: IsEnvVarName."""
    errs = [] if _ENV_VAR_NAME.match(value) else ["not a valid environment variable name"]
    return errs + _no_chdir_prefix(value)


def is_config_map_key(value: str) -> Errors:
    """validation.go: IsConfigMapKey (ConfigMap and Secret keys)."""
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _CONFIG_MAP_KEY.match(value):
        errs.append("a valid config key must consist of alphanumerics, '-', '_' or '.'")
    return errs + _no_chdir_prefix(value)


def is_valid_percent(value: str) -> Errors:
    """validation.go: IsValidPercent."""
    return [] if _PERCENT.match(value) else ["a valid percent string is digits then '%'"]


def is_valid_ip(value: str) -> Errors:
    """validation.go: IsValidIP (Python, like kube's strict parser, refuses leading zeros)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
    return []


def labels(values: Any, path: str) -> Errors:
    """meta/v1/validation: ValidateLabels: qualified-name keys, label values."""
    errs = []
    for key, value in (values or {}).items():
        errs += [f"{path}: Invalid value: {key!r}: {m}" for m in is_qualified_name(key)]
        if not isinstance(value, str):
            errs.append(f"{path}[{key}]: must be a string")
        else:
            errs += [f"{path}[{key}]: Invalid value: {value!r}: {m}" for m in is_label_value(value)]
    return errs


def annotations(values: Any, path: str) -> Errors:
    """objectmeta.go: ValidateAnnotations: lowercased keys are qualified names; 256 KiB in all."""
    errs = []
    total = 0
    for key, value in (values or {}).items():
        errs += [f"{path}: Invalid value: {key!r}: {m}" for m in is_qualified_name(key.lower())]
        if not isinstance(value, str):
            errs.append(f"{path}[{key}]: must be a string")
            continue
        total += len(key) + len(value)
    if total > ANNOTATIONS_MAX_BYTES:
        errs.append(f"{path}: Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes")
    return errs


_SELECTOR_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


def label_selector(selector: Any, path: str) -> Errors:
    """meta/v1/validation: ValidateLabelSelector (strict label values, as for new objects)."""
    if selector is None:
        return []
    errs = labels(selector.get("matchLabels"), f"{path}.matchLabels")
    for i, req in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        op, values = req.get("operator"), req.get("values") or []
        if op not in _SELECTOR_OPERATORS:
            errs.append(f"{where}.operator: Invalid value: {op!r}: not a valid selector operator")
        elif op in ("In", "NotIn") and not values:
            errs.append(f"{where}.values: Required value: needed with 'In' or 'NotIn'")
        elif op in ("Exists", "DoesNotExist") and values:
            errs.append(f"{where}.values: Forbidden: not with 'Exists' or 'DoesNotExist'")
        errs += [f"{where}.key: {m}" for m in is_qualified_name(req.get("key", ""))]
        for value in values:
            errs += [f"{where}.values: {value!r}: {m}" for m in is_label_value(value)]
    return errs


NameCheck = Callable[[str], Errors]


def object_meta(
    meta: Any, *, namespaced: bool, name_check: NameCheck, path: str = "metadata"
) -> Errors:
    """objectmeta.go: ValidateObjectMeta (via core/validation.go ValidateObjectMeta)."""
    if not isinstance(meta, dict):
        return [f"{path}: Required value"]
    errs = []
    name = meta.get("name")
    if not name:
        errs.append(f"{path}.name: Required value: name or generateName is required")
    else:
        errs += [f"{path}.name: Invalid value: {name!r}: {m}" for m in name_check(name)]
    namespace = meta.get("namespace")
    # ValidateNamespaceName: a DNS-1123 label. kubectl fills it from the context when
    # unset. (For cluster-scoped kinds the REST layer clears it before validating.)
    if namespaced and namespace is not None:
        errs += [f"{path}.namespace: {namespace!r}: {m}" for m in is_dns1123_label(namespace)]
    errs += labels(meta.get("labels"), f"{path}.labels")
    errs += annotations(meta.get("annotations"), f"{path}.annotations")
    return errs
