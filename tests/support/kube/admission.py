"""ValidatingAdmissionPolicy and its binding, as kube-apiserver validates them on create.

Source: kubernetes/kubernetes pkg/apis/admissionregistration/validation/validation.go
(ValidateValidatingAdmissionPolicy, validateValidatingAdmissionPolicySpec,
validateMatchResources, validateNamedRuleWithOperations, validateRuleWithOperations,
validateRule, validateResources, validateMatchConditions, validateMatchCondition,
validateValidation, ValidateValidatingAdmissionPolicyBinding,
validateValidationActions), after the v1 defaults of
pkg/apis/admissionregistration/v1/defaults.go (SetDefaults_ValidatingAdmissionPolicySpec,
SetDefaults_MatchResources, SetDefaults_Rule). CEL expressions are compiled with
cel-python: a syntax error is refused as kube's compiler would; kube's type checks
(against the request's declared types) are not repeated here.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import celpy

from .names import Errors, is_dns1123_subdomain, is_qualified_name, label_selector, object_meta

FAILURE_POLICIES = {"Fail", "Ignore"}
MATCH_POLICIES = {"Exact", "Equivalent"}
OPERATIONS = {"*", "CREATE", "UPDATE", "DELETE", "CONNECT"}
SCOPES = {"Cluster", "Namespaced", "*"}
# supportedValidationPolicyReason: Unauthorized is not among them.
VALIDATION_REASONS = {"Forbidden", "Invalid", "RequestEntityTooLarge"}
VALIDATION_ACTIONS = {"Deny", "Warn", "Audit"}
MAX_MATCH_CONDITIONS = 64


def default_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """v1 defaults.go: failurePolicy Fail; matchPolicy Equivalent; empty selectors; scope *."""
    doc = copy.deepcopy(policy)
    spec = doc.setdefault("spec", {})
    spec.setdefault("failurePolicy", "Fail")
    if spec.get("matchConstraints") is not None:
        _default_match_resources(spec["matchConstraints"])
    return doc


def _default_match_resources(match: dict[str, Any]) -> None:
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for rule in match.get("resourceRules") or []:
        rule.setdefault("scope", "*")
    for rule in match.get("excludeResourceRules") or []:
        rule.setdefault("scope", "*")


def _has_wildcard(values: list[str]) -> bool:
    return "*" in values


def validate_resources(resources: list[str], path: str) -> Errors:
    """validateResources: the wildcard rules for resource/subresource lists."""
    errs: Errors = []
    if not resources:
        errs.append(f"{path}: Required value")
    with_wildcard_sub: set[str] = set()  # x/*
    sub_with_wildcard_res: set[str] = set()  # */x
    has_double = has_single = has_plain = False
    for i, res_sub in enumerate(resources):
        if res_sub == "":
            errs.append(f"{path}[{i}]: Required value")
            continue
        has_double = has_double or res_sub == "*/*"
        has_single = has_single or res_sub == "*"
        if "/" not in res_sub:
            # kube assigns, not ORs: the last plain entry decides (kept as written).
            has_plain = res_sub != "*"
            continue
        res, sub = res_sub.split("/", 1)
        if res in with_wildcard_sub:
            errs.append(
                f"{path}[{i}]: Invalid value: if '{res}/*' is present, must not specify {res_sub}"
            )
        if sub in sub_with_wildcard_res:
            errs.append(
                f"{path}[{i}]: Invalid value: if '*/{sub}' is present, must not specify {res_sub}"
            )
        if sub == "*":
            with_wildcard_sub.add(res)
        if res == "*":
            sub_with_wildcard_res.add(sub)
    if len(resources) > 1 and has_double:
        errs.append(
            f"{path}: Invalid value: {_go_strings(resources)}: "
            "if '*/*' is present, must not specify other resources"
        )
    if has_single and has_plain:
        errs.append(
            f"{path}: Invalid value: {_go_strings(resources)}: "
            "if '*' is present, must not specify other resources without subresources"
        )
    return errs


def _go_strings(values: list[str]) -> str:
    """How kube's field.Invalid prints a []string: ``[]string{"*", "*/*"}``."""
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


def validate_rule_with_operations(rule: dict[str, Any], path: str) -> Errors:
    """validateRuleWithOperations + validateRule (allowSubResource: true)."""
    errs: Errors = []
    operations = rule.get("operations") or []
    if not operations:
        errs.append(f"{path}.operations: Required value")
    if len(operations) > 1 and _has_wildcard(operations):
        errs.append(
            f"{path}.operations: Invalid value: if '*' is present, must not specify "
            "other operations"
        )
    for i, op in enumerate(operations):
        if op not in OPERATIONS:
            errs.append(f"{path}.operations[{i}]: Unsupported value: {op!r}")
    groups = rule.get("apiGroups") or []
    if not groups:
        errs.append(f"{path}.apiGroups: Required value")
    if len(groups) > 1 and _has_wildcard(groups):
        errs.append(
            f"{path}.apiGroups: Invalid value: if '*' is present, must not specify other API groups"
        )
    versions = rule.get("apiVersions") or []
    if not versions:
        errs.append(f"{path}.apiVersions: Required value")
    if len(versions) > 1 and _has_wildcard(versions):
        errs.append(
            f"{path}.apiVersions: Invalid value: if '*' is present, must not "
            "specify other API versions"
        )
    for i, version in enumerate(versions):
        if version == "":
            errs.append(f"{path}.apiVersions[{i}]: Required value")
    errs += validate_resources(rule.get("resources") or [], f"{path}.resources")
    if rule.get("scope") not in SCOPES:
        errs.append(f"{path}.scope: Unsupported value: {rule.get('scope')!r}")
    return errs


def validate_match_resources(match: Any, path: str) -> Errors:
    """validateMatchResources (each NamedRuleWithOperations: validateNamedRuleWithOperations)."""
    if match is None:
        return []
    errs: Errors = []
    if match.get("matchPolicy") not in MATCH_POLICIES:
        errs.append(f"{path}.matchPolicy: Unsupported value: {match.get('matchPolicy')!r}")
    for key in ("namespaceSelector", "objectSelector"):
        if match.get(key) is None:
            errs.append(f"{path}.{key}: Required value")
        else:
            errs += label_selector(match[key], f"{path}.{key}")
    for key in ("resourceRules", "excludeResourceRules"):
        for i, rule in enumerate(match.get(key) or []):
            where = f"{path}.{key}[{i}]"
            names = rule.get("resourceNames") or []
            if len(set(names)) != len(names):
                errs.append(f"{where}.resourceNames: Duplicate value")
            errs += validate_rule_with_operations(rule, where)
    return errs


def compile_cel(expression: str, path: str) -> Errors:
    """The expression must compile (kube: plugincel.Compiler.CompileCELExpression)."""
    try:
        celpy.Environment().compile(expression)
    except celpy.CELParseError as exc:
        return [f"{path}: Invalid value: compilation failed: {str(exc).splitlines()[0]}"]
    return []


def validate_match_conditions(conditions: list[dict[str, Any]], path: str) -> Errors:
    """validateMatchConditions + validateMatchCondition."""
    errs: Errors = []
    if len(conditions) > MAX_MATCH_CONDITIONS:
        errs.append(
            f"{path}: Too many: {len(conditions)}: must have at most {MAX_MATCH_CONDITIONS} items"
        )
    seen: set[str] = set()
    for i, condition in enumerate(conditions):
        where = f"{path}[{i}]"
        expression = (condition.get("expression") or "").strip()
        if not expression:
            errs.append(f"{where}.expression: Required value")
        else:
            errs += compile_cel(expression, f"{where}.expression")
        name = condition.get("name") or ""
        if not name:
            errs.append(f"{where}.name: Required value")
        else:
            errs += [f"{where}.name: {m}" for m in is_qualified_name(name)]
            if name in seen:
                errs.append(f"{where}.name: Duplicate value: {name!r}")
            seen.add(name)
    return errs


_NEWLINES = re.compile(r"[\n\r]+")


def validate_validation(validation: dict[str, Any], path: str) -> Errors:
    """validateValidation: expression required; message one line; reason in the set."""
    errs: Errors = []
    expression = (validation.get("expression") or "").strip()
    if not expression:
        errs.append(f"{path}.expression: Required value: expression is not specified")
    else:
        errs += compile_cel(expression, f"{path}.expression")
    message_expression = validation.get("messageExpression")
    if message_expression is not None:
        if not message_expression.strip():
            errs.append(f"{path}.messageExpression: Invalid value: must be non-empty if specified")
        else:
            errs += compile_cel(message_expression, f"{path}.messageExpression")
    message = validation.get("message")
    if message is not None:
        if not message.strip():
            errs.append(f"{path}.message: Invalid value: message must be non-empty if specified")
        elif _NEWLINES.search(message.strip()):
            errs.append(f"{path}.message: Invalid value: message must not contain line breaks")
    reason = validation.get("reason")
    if reason is not None and reason not in VALIDATION_REASONS:
        errs.append(f"{path}.reason: Unsupported value: {reason!r}")
    return errs


def validate_policy(policy: dict[str, Any]) -> Errors:
    """ValidateValidatingAdmissionPolicy, on the defaulted object."""
    doc = default_policy(policy)
    errs = object_meta(doc.get("metadata"), namespaced=False, name_check=is_dns1123_subdomain)
    spec = doc["spec"]
    if spec.get("failurePolicy") not in FAILURE_POLICIES:
        errs.append(f"spec.failurePolicy: Unsupported value: {spec.get('failurePolicy')!r}")
    if spec.get("paramKind") is not None:
        errs.append("spec.paramKind: not encoded here (deploy/ uses no parameters)")
    match = spec.get("matchConstraints")
    if match is None:
        errs.append("spec.matchConstraints: Required value")
    else:
        errs += validate_match_resources(match, "spec.matchConstraints")
        # At least one resourceRule, to provide type information.
        if not match.get("resourceRules"):
            errs.append("spec.matchConstraints.resourceRules: Required value")
    errs += validate_match_conditions(spec.get("matchConditions") or [], "spec.matchConditions")
    validations = spec.get("validations") or []
    if not validations and not spec.get("auditAnnotations"):
        errs.append(
            "spec.validations: Required value: validations or auditAnnotations "
            "must contain at least one item"
        )
    for i, validation in enumerate(validations):
        errs += validate_validation(validation, f"spec.validations[{i}]")
    if spec.get("auditAnnotations") or spec.get("variables"):
        errs.append("spec: auditAnnotations/variables are not encoded here (deploy/ uses none)")
    return errs


def validate_validation_actions(actions: list[str], path: str) -> Errors:
    """validateValidationActions."""
    errs: Errors = []
    seen: set[str] = set()
    for i, action in enumerate(actions):
        if action not in VALIDATION_ACTIONS:
            errs.append(f"{path}[{i}]: Unsupported value: {action!r}")
        if action in seen:
            errs.append(f"{path}[{i}]: Duplicate value: {action!r}")
        seen.add(action)
    if {"Deny", "Warn"} <= seen:
        errs.append(f"{path}: Invalid value: must not contain both Deny and Warn")
    if not seen:
        errs.append(f"{path}: Required value: at least one validation action is required")
    return errs


def validate_binding(binding: dict[str, Any]) -> Errors:
    """ValidateValidatingAdmissionPolicyBinding, on the defaulted object."""
    errs = object_meta(binding.get("metadata"), namespaced=False, name_check=is_dns1123_subdomain)
    spec = copy.deepcopy(binding.get("spec") or {})
    policy_name = spec.get("policyName") or ""
    if not policy_name:
        errs.append("spec.policyName: Required value")
    else:
        errs += [f"spec.policyName: {m}" for m in is_dns1123_subdomain(policy_name)]
    if spec.get("paramRef") is not None:
        errs.append("spec.paramRef: not encoded here (deploy/ uses no parameters)")
    if spec.get("matchResources") is not None:
        _default_match_resources(spec["matchResources"])
        errs += validate_match_resources(spec["matchResources"], "spec.matchResouces")
    errs += validate_validation_actions(
        spec.get("validationActions") or [], "spec.validationActions"
    )
    return errs
