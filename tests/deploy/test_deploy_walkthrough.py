"""A new user's walkthrough: what each config names reaches the pod deploy/ defines.

For every gateway overlay an operator may apply, the rendered Deployment's container is
projected as kubelet would (tests/support/kubelet.py), from the rendered ConfigMaps and
the Secrets created as deploy/base/secret.example.yaml says. Then, for the overlay's
own gateway.yaml, for config/gateway.yaml (the reference, written for the same
layout) and for every config example in docs/backends/, each file and environment
variable the config names (found by walking the schema: tests/support/config_refs.py)
must be mounted or set in that container, credentials as keys of the authn-gateway
Secret under /etc/authn-gateway/secrets/. Finally ``authn-gateway check-config`` runs
on the configs inside that projected pod.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.support import kubelet
from tests.support.config_refs import Ref, references
from tests.support.deploy_pod import check_config_in_pod, cluster_objects, container
from tests.support.kube.names import is_config_map_key
from tests.support.kustomize import DEPLOY, GATEWAY_OVERLAYS, config_of, find, render

ROOT = DEPLOY.parent

OVERLAYS = (*GATEWAY_OVERLAYS, "overlays/my-cluster")

SECRETS_DIR = PurePosixPath("/etc/authn-gateway/secrets")

REFERENCE = ROOT / "config" / "gateway.yaml"


def docs_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every YAML example in docs/backends/ that is a gateway config, or backend entries."""
    examples = []
    for doc in sorted((ROOT / "docs" / "backends").glob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # an elided example ("[...]"): not a config
            if isinstance(data, list) and all(isinstance(d, dict) and "type" in d for d in data):
                data = {"backends": data}
            if isinstance(data, dict) and "backends" in data:
                examples.append((f"{doc.name}#{i + 1}", data))
    return examples


def secret_keys(refs: list[Ref]) -> set[str]:
    return {
        str(PurePosixPath(r.value).relative_to(SECRETS_DIR))
        for r in refs
        if r.kind == "file" and PurePosixPath(r.value).is_relative_to(SECRETS_DIR)
    }


def unmet(refs: list[Ref], mounts: list[kubelet.Mount], env: set[str]) -> list[str]:
    """Each reference the pod cannot satisfy, and why."""
    problems = []
    for ref in refs:
        if ref.kind == "env":
            if ref.value not in env:
                problems.append(f"{ref.field}: env:{ref.value} is not set in the container")
            continue
        mount = kubelet.mount_of(ref.value, mounts)
        if mount is None:
            problems.append(f"{ref.field}: {ref.value} is on no mount")
            continue
        relative = str(PurePosixPath(ref.value).relative_to(mount.path))
        if ref.kind == "written":
            if not mount.writable:
                problems.append(f"{ref.field}: {ref.value} is written, on a read-only mount")
        elif mount.path == SECRETS_DIR:
            # The whole Secret is mounted: the file is a key the operator adds.
            if "/" in relative or is_config_map_key(relative):
                problems.append(f"{ref.field}: {relative!r} cannot be a key of the Secret")
        elif relative not in mount.files:
            problems.append(f"{ref.field}: {ref.value} is not among {sorted(mount.files)}")
    return problems


def configs_for(overlay: str) -> list[tuple[str, dict[str, Any]]]:
    configs = [(f"{overlay} gateway.yaml", config_of(render(overlay)))]
    if overlay == "base":
        configs.append(("config/gateway.yaml", yaml.safe_load(REFERENCE.read_text())))
        configs += docs_examples()
    return configs


def test_the_docs_have_backend_examples_to_walk_through() -> None:
    names = {name.split("#")[0] for name, _ in docs_examples()}
    assert names >= {"keystone.md", "ldap.md", "jwt.md"}, names
    types = {b["type"] for _, c in docs_examples() for b in c["backends"]}
    assert types >= {"keystone", "ldap", "jwt", "introspection"}, types


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_file_and_variable_a_config_names_reaches_the_pod(overlay: str) -> None:
    docs = render(overlay)
    pod, ctr = container(docs)
    configs = configs_for(overlay)
    needed = {k for _, config in configs for k in secret_keys(references(config))}
    objects = cluster_objects(docs, needed)
    mounts = kubelet.mounts(pod, ctr, objects)
    env = {v["name"] for v in ctr.get("env") or []}
    problems = {
        name: found for name, config in configs if (found := unmet(references(config), mounts, env))
    }
    assert problems == {}, f"not wired in {overlay}'s Deployment: {problems}"
    # Backend credentials are files of the one Secret, never variables to add per backend.
    for name, config in configs:
        variables = {r.value for r in references(config) if r.kind == "env"}
        assert variables <= {"AUTHN_GATEWAY_SECRET"}, (name, variables)


def test_credentials_are_read_from_the_authn_gateway_secret_mounted_whole() -> None:
    pod, ctr = container(render("base"))
    [mount] = [m for m in ctr["volumeMounts"] if m["mountPath"] == str(SECRETS_DIR)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "authn-gateway"
    # Whole (no items): a key added later appears without editing the Deployment.
    assert "items" not in volume["secret"]
    assert mount["readOnly"] is True
    # Readable by the gateway's group only (fsGroup), not by any other user.
    assert volume["secret"]["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # The path scheme is documented in one place, and the docs' examples follow it.
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "file:/etc/authn-gateway/secrets/<key>" in operations
    for _, config in docs_examples():
        for ref in references(config):
            if ref.kind == "file":
                assert PurePosixPath(ref.value).parent == SECRETS_DIR, ref


def test_a_config_naming_an_unmounted_file_or_unset_variable_is_caught() -> None:
    docs = render("base")
    pod, ctr = container(docs)
    mounts = kubelet.mounts(pod, ctr, cluster_objects(docs, set()))
    config = {
        "deny_list": {"file": "/etc/authn-gateway/secrets/deny.json"},
        "backends": [
            {"name": "k", "type": "keystone", "auth_url": "https://k/v3",
             "service": {"username": "u", "password": "file:/etc/authn-gateway/keystone-password"},
             "tls": {"ca_file": "/etc/authn-gateway/secrets/nested/ca.crt"}},
            {"name": "l", "type": "ldap", "url": "ldaps://l", "bind_dn": "cn=x",
             "bind_password": "env:LDAP_BIND_PASSWORD", "user_base": "dc=x"},
        ],
    }  # fmt: skip
    problems = unmet(references(config), mounts, {"AUTHN_GATEWAY_SECRET"})
    assert problems == [
        "deny_list.file: /etc/authn-gateway/secrets/deny.json is written, on a read-only mount",
        "backends[0].service.password: /etc/authn-gateway/keystone-password is on no mount",
        "backends[0].tls.ca_file: 'nested/ca.crt' cannot be a key of the Secret",
        "backends[1].bind_password: env:LDAP_BIND_PASSWORD is not set in the container",
    ], problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_config_passes_check_config_in_its_pod(overlay: str, tmp_path: Path) -> None:
    cm = find(render(overlay), "ConfigMap", "authn-gateway-config")
    text = cm["data"]["gateway.yaml"]
    out = check_config_in_pod(overlay, text, set(), tmp_path)
    assert ": ok; backends:" in out


@pytest.mark.parametrize(
    "name", [name for name, _ in docs_examples() if not name.startswith("jwt.md")]
)
def test_the_docs_examples_pass_check_config_in_the_pod(name: str, tmp_path: Path) -> None:
    # (jwt.md's examples carry an elided certificateAuthority PEM, inline by kube's design.)
    [config] = [c for n, c in docs_examples() if n == name]
    needed = secret_keys(references(config))
    out = check_config_in_pod("base", yaml.safe_dump(config), needed, tmp_path)
    assert ": ok; backends:" in out
