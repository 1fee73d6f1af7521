"""config/gateway.yaml, the reference "with every option": it holds every option of the
schema, and it passes ``authn-gateway check-config`` as shipped, in the pod deploy/
defines (its paths are that pod's).

The options are found by walking the pydantic schema (authn_gateway.config.GatewayConfig
and every backend's settings class), so an option added to the code without a line in
the reference fails here. An option that excludes another one (a Keystone application
credential instead of a password) is shown commented out next to it: those are listed
below, each with why, and must appear in a comment.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from authn_gateway.config import GatewayConfig
from backends.registry import settings_types
from tests.support.config_refs import references
from tests.support.deploy_pod import check_config_in_pod
from tests.support.kustomize import ROOT

REFERENCE = ROOT / "config" / "gateway.yaml"

#: Options shown commented out, and why each cannot be active in the same file.
#: Backend options are written "<type>:<path>".
COMMENTED: dict[str, str] = {
    "previous_secrets": "only while a gateway secret is being rotated",
    "deny_list.file": "only without redis (with it the deny list lives in Redis)",
    "redis.sentinels": "instead of redis.url",
    "redis.sentinel_master": "with redis.sentinels only",
    "redis.tls": "with a rediss:// url only (the reference's is redis://)",
    "redis.tls.ca_file": "with a rediss:// url only (the reference's is redis://)",
    "static:tokens": "inline tokens, instead of (or with) the token file",
    "keystone:service.project_name": "instead of system_scope",
    "keystone:service.project_domain_name": "with project_name only",
    "keystone:service.application_credential_id": "instead of username/password",
    "keystone:service.application_credential_secret": "instead of username/password",
    "ldap:user_dn_template": "direct mode, instead of user_base/user_filter",
    "ldap:groups.base": "with groups.mode: search only",
    "jwt:issuer.discoveryURL": "only when discovery is not under issuer.url",
    "jwt:issuer.certificateAuthority": "a real PEM, inline (kube's field)",
    "jwt:claimMappings.username.expression": "instead of claim/prefix",
    "jwt:claimMappings.groups.expression": "instead of claim/prefix",
    "jwt:claimMappings.uid.expression": "instead of claim",
}


def _models(annotation: Any) -> list[type[BaseModel]]:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, dict):
        return [m for arg in get_args(annotation) for m in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def option_paths(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Every option of ``cls``, nested ones as dotted paths (items of lists included)."""
    paths = []
    for name, field in cls.model_fields.items():
        if cls is GatewayConfig and name == "backends":
            continue  # walked per backend type
        path = f"{prefix}.{field.alias or name}" if prefix else field.alias or name
        paths.append(path)
        for model in _models(field.annotation):
            paths += option_paths(model, path)
    return paths


def present(data: Any, path: str) -> bool:
    """Whether ``path`` is set in ``data`` (in any item, through lists)."""
    level = [data]
    for part in path.split("."):
        nxt = []
        for node in level:
            items = node if isinstance(node, list) else [node]
            nxt += [i[part] for i in items if isinstance(i, dict) and part in i]
        if not nxt:
            return False
        level = nxt
    return True


def backend_type(cls: type[BaseModel]) -> str:
    (name,) = get_args(cls.model_fields["type"].annotation)
    return str(name)


def _field(cls: type[BaseModel], key: str) -> Any:
    return next((f for n, f in cls.model_fields.items() if (f.alias or n) == key), None)


def missing_options(reference: dict[str, Any]) -> list[str]:
    """The options the reference does not set; a backend option as "<type>:<path>", one
    several types share (same field, same type: timeouts, tls, the kube claim rules of
    jwt and introspection) under each of them."""
    missing = [p for p in option_paths(GatewayConfig) if not present(reference, p)]
    backends = reference["backends"]
    for cls in settings_types():
        kind = backend_type(cls)
        for path in option_paths(cls):
            own = _field(cls, path.split(".")[0])
            sharing = {
                backend_type(other)
                for other in settings_types()
                if (f := _field(other, path.split(".")[0])) is not None
                and f.annotation == own.annotation
            }
            # A shared option is shown once, on any backend that has it.
            if not present([b for b in backends if b["type"] in sharing], path):
                missing.append(f"{kind}:{path}")
    return missing


def _same_field(kind: str, other: str, path: str) -> bool:
    """Whether backend types ``kind`` and ``other`` have the same option at ``path``."""
    if kind == other:
        return True
    if not kind or not other:
        return False
    classes = {backend_type(c): c for c in settings_types()}
    a, b = (_field(classes[k], path.split(".")[0]) for k in (kind, other))
    return a is not None and b is not None and a.annotation == b.annotation


def commented_out(option: str) -> bool:
    """Whether ``option``, or an option it is part of, is listed as shown commented out,
    for its own backend type or another type sharing the same field."""
    kind, _, path = option.rpartition(":")
    parts = path.split(".")
    for i in range(len(parts)):
        prefix = ".".join(parts[: i + 1])
        for listed in COMMENTED:
            other, _, listed_path = listed.rpartition(":")
            if listed_path == prefix and _same_field(kind, other, prefix):
                return True
    return False


def test_the_reference_holds_every_option_of_the_schema() -> None:
    reference = yaml.safe_load(REFERENCE.read_text())
    missing = missing_options(reference)
    absent = [option for option in missing if not commented_out(option)]
    assert absent == [], f"options in the schema but not in config/gateway.yaml: {absent}"
    # Each commented one is really commented in, not silently dropped; and one made
    # active since must leave the list.
    comments = "\n".join(
        line for line in REFERENCE.read_text().splitlines() if line.lstrip().startswith("#")
    )
    for option in COMMENTED:
        key = option.split(":")[-1].split(".")[-1]
        assert re.search(rf"#\s*(- )?{re.escape(key)}:", comments), f"{option}: no '# {key}:'"
    assert set(COMMENTED) <= set(missing), sorted(set(COMMENTED) - set(missing))


def test_a_new_option_without_a_line_in_the_reference_is_caught() -> None:
    reference = yaml.safe_load(REFERENCE.read_text())
    keystone = next(b for b in reference["backends"] if b["type"] == "keystone")
    del keystone["groups"]["max_pages"]
    del reference["logging"]["outage_summary_seconds"]
    missing = missing_options(reference)
    assert "keystone:groups.max_pages" in missing
    assert "logging.outage_summary_seconds" in missing


def test_the_reference_names_no_variable_but_the_gateway_secret() -> None:
    # Every credential is a file of the authn-gateway Secret in the pod; the one
    # variable is the gateway secret the Deployment sets.
    reference = yaml.safe_load(REFERENCE.read_text())
    variables = {r.value for r in references(reference) if r.kind == "env"}
    assert variables == {"AUTHN_GATEWAY_SECRET"}


def test_the_reference_passes_check_config_as_shipped_in_the_pod(tmp_path: Path) -> None:
    reference = yaml.safe_load(REFERENCE.read_text())
    needed = {
        Path(r.value).name
        for r in references(reference)
        if r.kind == "file" and r.value.startswith("/etc/authn-gateway/secrets/")
    }
    # The admin API is off in the reference, so its token is not read: the Secret need
    # not hold it.
    assert reference["admin"]["enabled"] is False
    needed.discard("admin-token")
    out = check_config_in_pod("base", REFERENCE.read_text(), needed, tmp_path)
    types_checked = {backend_type(cls) for cls in settings_types()}
    for kind in types_checked:
        assert f"({kind})" in out, f"{kind} not among the backends check-config built: {out}"
