"""kube-apiserver's authorization wiring as it reads it from files: the legacy flags
(--authorization-mode and the --authorization-webhook-* flags) and the structured
AuthorizationConfiguration (--authorization-config).

Sources (kubernetes/kubernetes):
- pkg/kubeapiserver/options/authorization.go: BuiltInAuthorizationOptions.Validate (the
  legacy flags; --authorization-config mutually exclusive with them, AreLegacyFlagsSet),
  AddFlags (authorization-mode is a StringSlice: comma separated; the TTLs are
  time.Duration), buildAuthorizationConfiguration (the flags as a configuration: the
  webhook named "default", timeout 30s, failurePolicy NoOpinion);
- pkg/kubeapiserver/authorizer/modes/modes.go: AuthorizationModeChoices;
- pkg/kubeapiserver/authorizer/reload.go: repeatableAuthorizerTypes (Webhook),
  LoadAndValidateData (a non-webhook authorizer's name is its type in lower case);
- staging/src/k8s.io/apiserver/pkg/apis/apiserver/load/load.go: LoadFromData, a strict
  decoder (serializer.EnableStrict: an unknown or duplicated field is an error);
- staging/src/k8s.io/apiserver/pkg/apis/apiserver/v1/types.go (AuthorizationConfiguration,
  AuthorizerConfiguration, WebhookConfiguration, WebhookConnectionInfo,
  WebhookMatchCondition) and v1/defaults.go (SetDefaults_WebhookConfiguration:
  authorizedTTL 5m, unauthorizedTTL 30s when zero);
- staging/src/k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go:
  ValidateAuthorizationConfiguration, ValidateWebhookConfiguration, compileMatchConditions
  (the webhook's errors are reported under authorizers[i], not authorizers[i].webhook,
  as kube passes the authorizer's path);
- staging/src/k8s.io/apiserver/pkg/authorization/cel/compile.go: convertObjectToUnstructured
  (what a matchCondition's ``request`` holds: user, groups, uid and extra always, extra
  empty when the review has none, and the attributes given).

Where kube stats a file on the control-plane node (connectionInfo.kubeConfigFile), the
caller says which absolute paths are installed there as regular files. A matchCondition
is compiled with cel-python: a syntax error is refused as kube's compiler would; kube's
type check (that it is a bool over a v1 SubjectAccessReview) is for the tests that
evaluate it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import celpy

from .names import Errors, is_dns1123_subdomain

MODES = ("AlwaysAllow", "AlwaysDeny", "ABAC", "Webhook", "RBAC", "Node")
REPEATABLE = ("Webhook",)
API_VERSIONS = (
    "apiserver.config.k8s.io/v1alpha1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1",
)
FAILURE_POLICIES = ("NoOpinion", "Deny")
CONNECTION_TYPES = ("InClusterConfig", "KubeConfigFile")
MAX_MATCH_CONDITIONS = 64

# The Go types' JSON fields, for strict decoding.
_FIELDS: dict[str, tuple[str, ...]] = {
    "": ("apiVersion", "kind", "authorizers"),
    "authorizer": ("type", "name", "webhook"),
    "webhook": (
        "authorizedTTL",
        "unauthorizedTTL",
        "timeout",
        "subjectAccessReviewVersion",
        "matchConditionSubjectAccessReviewVersion",
        "failurePolicy",
        "connectionInfo",
        "matchConditions",
    ),
    "connectionInfo": ("type", "kubeConfigFile"),
    "matchCondition": ("expression",),
}
DURATIONS = ("authorizedTTL", "unauthorizedTTL", "timeout")

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds, as Go's time.ParseDuration reads ``text`` ("5m", "1h30m", "300ms");
    ValueError otherwise (a bare number other than 0 has no unit)."""
    sign, rest = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.lstrip("+"))
    if rest == "0":
        return 0.0
    total, at = 0.0, 0
    for match in _PART.finditer(rest):
        if match.start() != at:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    if not rest or at != len(rest):
        raise ValueError(f'time: invalid duration "{text}"')
    return sign * total


def _go(seconds: float) -> str:
    """A duration as Go's Duration.String() writes the round values used here."""
    if seconds and seconds % 60 == 0:
        return f"{int(seconds // 60)}m0s"
    return f"{seconds:g}s"


# --- the structured configuration -----------------------------------------------------


def load_authorization_configuration(doc: Any) -> tuple[dict[str, Any], Errors]:
    """LoadFromData on a parsed file: the configuration (defaulted) and the decoding
    errors (strict: unknown fields; durations Go must parse)."""
    errs: Errors = []
    if not isinstance(doc, dict):
        return {}, ["expected an AuthorizationConfiguration object"]
    if doc.get("apiVersion") not in API_VERSIONS or doc.get("kind") != "AuthorizationConfiguration":
        errs.append(
            f'no kind "{doc.get("kind")}" is registered for version "{doc.get("apiVersion")}"'
        )
    errs += _unknown(doc, "", "")
    config: dict[str, Any] = {"authorizers": []}
    for i, item in enumerate(doc.get("authorizers") or []):
        where = f"authorizers[{i}]"
        errs += _unknown(item, "authorizer", where)
        authorizer = {"type": item.get("type", ""), "name": item.get("name", "")}
        webhook = item.get("webhook")
        if webhook is not None:
            errs += _unknown(webhook, "webhook", f"{where}.webhook")
            errs += _unknown(webhook.get("connectionInfo") or {}, "connectionInfo",
                             f"{where}.webhook.connectionInfo")  # fmt: skip
            for j, condition in enumerate(webhook.get("matchConditions") or []):
                errs += _unknown(
                    condition, "matchCondition", f"{where}.webhook.matchConditions[{j}]"
                )
            decoded = dict(webhook)
            for name in DURATIONS:
                try:
                    decoded[name] = go_duration(str(webhook.get(name, "0")))
                except ValueError as exc:
                    errs.append(f"{where}.webhook.{name}: {exc}")
                    decoded[name] = 0.0
            # SetDefaults_WebhookConfiguration.
            decoded["authorizedTTL"] = decoded["authorizedTTL"] or 300.0
            decoded["unauthorizedTTL"] = decoded["unauthorizedTTL"] or 30.0
            authorizer["webhook"] = decoded
        config["authorizers"].append(authorizer)
    return config, errs


def _unknown(doc: Any, kind: str, where: str) -> Errors:
    if not isinstance(doc, dict):
        return [f"{where or 'the file'}: must be an object"]
    prefix = f"{where}." if where else ""
    return [
        f'strict decoding error: unknown field "{prefix}{key}"'
        for key in doc
        if key not in _FIELDS[kind]
    ]


def validate_authorization_configuration(
    config: dict[str, Any], installed: Callable[[str], bool]
) -> Errors:
    """ValidateAuthorizationConfiguration, then LoadAndValidateData's name rule.
    ``installed(path)``: whether the absolute path is a regular file on the node."""
    errs: Errors = []
    authorizers = config.get("authorizers") or []
    if not authorizers:
        errs.append("authorizers: Required value: at least one authorization mode must be defined")
    seen_types: set[str] = set()
    seen_names: set[str] = set()
    for i, a in enumerate(authorizers):
        where = f"authorizers[{i}]"
        kind, name = a.get("type", ""), a.get("name", "")
        if not kind:
            errs.append(f"{where}.type: Required value")
            continue
        if kind not in MODES:
            supported = ", ".join(f'"{m}"' for m in sorted(MODES))
            errs.append(f'{where}.type: Unsupported value: "{kind}": supported values: {supported}')
            continue
        if kind in seen_types and kind not in REPEATABLE:
            errs.append(f'{where}.type: Duplicate value: "{kind}"')
            continue
        seen_types.add(kind)
        if not name:
            errs.append(f"{where}.name: Required value")
        elif name in seen_names:
            errs.append(f'{where}.name: Duplicate value: "{name}"')
        elif problems := is_dns1123_subdomain(name):
            errs.append(
                f'{where}.name: Invalid value: "{name}": authorizer name is invalid: '
                + ", ".join(problems)
            )
        seen_names.add(name)
        if kind == "Webhook":
            if a.get("webhook") is None:
                errs.append(f"{where}.webhook: Required value: required when type=Webhook")
                continue
            errs += validate_webhook(a["webhook"], where, installed)
        elif a.get("webhook") is not None:
            errs.append(
                f'{where}.webhook: Invalid value: "non-null": may only be specified when '
                "type=Webhook"
            )
    for a in authorizers:
        kind, name = a.get("type", ""), a.get("name", "")
        if kind and kind != "Webhook" and name != kind.lower():
            errs.append(f"expected name {kind.lower()} for authorizer {kind} instead of {name}")
    return errs


def validate_webhook(
    webhook: dict[str, Any], where: str, installed: Callable[[str], bool]
) -> Errors:
    """ValidateWebhookConfiguration and compileMatchConditions."""
    errs: Errors = []
    timeout = webhook.get("timeout", 0.0)
    if timeout == 0:
        errs.append(f"{where}.timeout: Required value")
    elif timeout > 30 or timeout < 0:
        errs.append(f'{where}.timeout: Invalid value: "{_go(timeout)}": must be > 0s and <= 30s')
    for name in ("authorizedTTL", "unauthorizedTTL"):
        if webhook.get(name, 0.0) < 0:
            errs.append(f'{where}.{name}: Invalid value: "{_go(webhook[name])}": must be > 0s')
    version = webhook.get("subjectAccessReviewVersion", "")
    if not version:
        errs.append(f"{where}.subjectAccessReviewVersion: Required value")
    elif version not in ("v1", "v1beta1"):
        errs.append(f'{where}.subjectAccessReviewVersion: Unsupported value: "{version}": '
                    'supported values: "v1", "v1beta1"')  # fmt: skip
    conditions = webhook.get("matchConditions") or []
    match_version = webhook.get("matchConditionSubjectAccessReviewVersion", "")
    if not match_version and conditions:
        errs.append(f"{where}.matchConditionSubjectAccessReviewVersion: Required value: "
                    "required if match conditions are specified")  # fmt: skip
    elif match_version and match_version != "v1":
        errs.append(f'{where}.matchConditionSubjectAccessReviewVersion: Unsupported value: '
                    f'"{match_version}": supported values: "v1"')  # fmt: skip
    policy = webhook.get("failurePolicy", "")
    if not policy:
        errs.append(f"{where}.failurePolicy: Required value")
    elif policy not in FAILURE_POLICIES:
        errs.append(f'{where}.failurePolicy: Unsupported value: "{policy}": '
                    'supported values: "NoOpinion", "Deny"')  # fmt: skip
    errs += _connection_info(webhook.get("connectionInfo") or {}, where, installed)
    errs += _match_conditions(conditions, where)
    return errs


def _connection_info(info: dict[str, Any], where: str, installed: Callable[[str], bool]) -> Errors:
    kind, path = info.get("type", ""), info.get("kubeConfigFile")
    at = f"{where}.connectionInfo"
    if not kind:
        return [f"{at}.type: Required value"]
    if kind == "InClusterConfig":
        if path is not None:
            return [f'{at}.kubeConfigFile: Invalid value: "{path}": can only be set when '
                    "type=KubeConfigFile"]  # fmt: skip
        return []
    if kind != "KubeConfigFile":
        return [f'{at}.type: Unsupported value: "{kind}": supported values: '
                '"InClusterConfig", "KubeConfigFile"']  # fmt: skip
    if not path:
        return [f"{at}.kubeConfigFile: Required value"]
    if not path.startswith("/"):
        return [f'{at}.kubeConfigFile: Invalid value: "{path}": must be an absolute path']
    if not installed(path):
        return [f'{at}.kubeConfigFile: Invalid value: "{path}": error loading file: '
                f"stat {path}: no such file or directory"]  # fmt: skip
    return []


def _match_conditions(conditions: list[dict[str, Any]], where: str) -> Errors:
    at = f"{where}.matchConditions"
    if len(conditions) > MAX_MATCH_CONDITIONS:
        return [
            f"{at}: Too many: {len(conditions)}: must have at most {MAX_MATCH_CONDITIONS} items"
        ]
    errs: Errors = []
    seen: set[str] = set()
    for i, condition in enumerate(conditions):
        path = f"{at}[{i}].expression"
        expression = condition.get("expression") or ""
        if not expression.strip():
            errs.append(f"{path}: Required value")
            continue
        if expression in seen:
            errs.append(f'{path}: Duplicate value: "{expression}"')
            continue
        seen.add(expression)
        try:
            celpy.Environment().compile(expression)
        except celpy.CELParseError as exc:
            first = str(exc).splitlines()[0]
            errs.append(f'{path}: Invalid value: "{expression}": compilation failed: {first}')
    return errs


# --- the legacy flags -----------------------------------------------------------------

AUTHORIZATION_FLAGS = (
    "authorization-mode",
    "authorization-policy-file",
    "authorization-webhook-config-file",
    "authorization-webhook-version",
    "authorization-webhook-cache-authorized-ttl",
    "authorization-webhook-cache-unauthorized-ttl",
    "authorization-config",
)
#: AreLegacyFlagsSet: the flags --authorization-config cannot be given with.
LEGACY_FLAGS = AUTHORIZATION_FLAGS[:1] + AUTHORIZATION_FLAGS[2:6]


#: StringSlice flags: a repeated one appends (pflag's stringSliceValue.Set: the first
#: value replaces the default, each later one is appended), where any other's last wins.
SLICE_FLAGS = ("authorization-mode",)


def parse_flags(words: Iterable[str]) -> tuple[dict[str, str], Errors]:
    """``--name=value`` words as pflag reads them (the last of a repeated flag wins, but
    a repeated --authorization-mode appends: ``Node,RBAC`` then ``Webhook`` is
    ``Node,RBAC,Webhook``); only the authorization flags are kept, any other
    --authorization-* is unknown, and any other flag (kube-apiserver has many) ignored."""
    flags: dict[str, str] = {}
    errs: Errors = []
    for word in words:
        name, eq, value = word.removeprefix("--").partition("=")
        if not word.startswith("--") or not eq:
            errs.append(f"{word}: not a --name=value flag")
        elif name in SLICE_FLAGS and name in flags:
            flags[name] += "," + value
        elif name in AUTHORIZATION_FLAGS:
            flags[name] = value
        elif name.startswith("authorization-"):
            errs.append(f"unknown flag: --{name}")
    return flags, errs


def validate_authorization_flags(flags: dict[str, str]) -> Errors:
    """BuiltInAuthorizationOptions.Validate, for the flags given."""
    if "authorization-config" in flags:
        if any(f in flags for f in LEGACY_FLAGS):
            return ["--authorization-config can not be specified when --authorization-mode "
                    "or --authorization-webhook-* flags are defined"]  # fmt: skip
        return []
    errs: Errors = []
    for name in ("authorization-webhook-cache-authorized-ttl",
                 "authorization-webhook-cache-unauthorized-ttl"):  # fmt: skip
        if name in flags:
            try:
                go_duration(flags[name])
            except ValueError as exc:
                errs.append(f'invalid argument "{flags[name]}" for "--{name}" flag: {exc}')
    modes = [m for m in flags.get("authorization-mode", "").split(",") if m]
    if not modes:
        errs.append("at least one authorization-mode must be passed")
    for mode in modes:
        if mode not in MODES:
            errs.append(f'authorization-mode "{mode}" is not a valid mode')
        if mode == "ABAC" and not flags.get("authorization-policy-file"):
            errs.append("authorization-mode ABAC's authorization policy file not passed")
        if mode == "Webhook" and not flags.get("authorization-webhook-config-file"):
            errs.append("authorization-mode Webhook's authorization config file not passed")
    if flags.get("authorization-policy-file") and "ABAC" not in modes:
        errs.append("cannot specify --authorization-policy-file without mode ABAC")
    if flags.get("authorization-webhook-config-file") and "Webhook" not in modes:
        errs.append("cannot specify --authorization-webhook-config-file without mode Webhook")
    if len(set(modes)) != len(modes):
        errs.append(f'authorization-mode "{modes}" has mode specified more than once')
    return errs


def configuration_from_flags(flags: dict[str, str]) -> dict[str, Any]:
    """buildAuthorizationConfiguration: the legacy flags as the configuration kube-apiserver
    then runs (the defaults of NewBuiltInAuthorizationOptions where a flag is absent)."""
    authorizers: list[dict[str, Any]] = []
    for mode in flags.get("authorization-mode", "").split(","):
        if mode != "Webhook":
            authorizers.append({"type": mode, "name": mode.lower()})
            continue
        webhook = {
            "authorizedTTL": go_duration(
                flags.get("authorization-webhook-cache-authorized-ttl", "5m")
            ),
            "unauthorizedTTL": go_duration(
                flags.get("authorization-webhook-cache-unauthorized-ttl", "30s")
            ),
            "timeout": 30.0,
            "failurePolicy": "NoOpinion",
            "subjectAccessReviewVersion": flags.get("authorization-webhook-version", "v1beta1"),
            "connectionInfo": {
                "type": "KubeConfigFile",
                "kubeConfigFile": flags.get("authorization-webhook-config-file", ""),
            },
        }
        authorizers.append({"type": "Webhook", "name": "default", "webhook": webhook})
    return {"authorizers": authorizers}


# --- what a matchCondition sees -------------------------------------------------------


def match_request(spec: dict[str, Any]) -> dict[str, Any]:
    """``request`` for a matchCondition, from a v1 SubjectAccessReview's spec."""
    request: dict[str, Any] = {
        "user": spec.get("user", ""),
        "groups": list(spec.get("groups") or []),
        "uid": spec.get("uid", ""),
        "extra": {k: list(v) for k, v in (spec.get("extra") or {}).items()},
    }
    for name, fields in (
        ("resourceAttributes",
         ("namespace", "verb", "group", "version", "resource", "subresource", "name")),
        ("nonResourceAttributes", ("path", "verb")),
    ):  # fmt: skip
        if spec.get(name) is not None:
            request[name] = {f: spec[name].get(f, "") for f in fields}
    return request
