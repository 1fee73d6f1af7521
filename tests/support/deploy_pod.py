"""The gateway's pod as deploy/ defines it, projected under a scratch root, and a config
checked there with the real ``authn-gateway check-config``.

The Secrets are those deploy/base/secret.example.yaml tells the operator to create,
with real values (a CA where a PEM goes, 32 random bytes where a secret goes), plus
the credential keys a config reads; kubelet's part is tests/support/kubelet.py.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support import kubelet
from tests.support.kustomize import DEPLOY, Doc, find, render
from tests.support.pki import issue, make_ca


def container(docs: tuple[Doc, ...]) -> tuple[Doc, Doc]:
    pod = find(docs, "Deployment", "authn-gateway")["spec"]["template"]["spec"]
    [ctr] = [c for c in pod["containers"] if c["name"] == "authn-gateway"]
    return pod, ctr


def secret_value(key: str) -> bytes:
    """What an operator puts under ``key``: a CA for a .crt/.pem, a token file for a
    .csv, else 32 random bytes, base64 (as the docs say to generate secrets)."""
    if key.endswith((".crt", ".pem")):
        return make_ca(f"walkthrough {key}").cert_pem()
    if key.endswith(".csv"):
        token = base64.urlsafe_b64encode(os.urandom(24)).decode()
        return f'{token},walker,1001,"developers"\n'.encode()
    return base64.b64encode(os.urandom(32))


def cluster_objects(docs: tuple[Doc, ...], extra_keys: set[str]) -> dict[tuple[str, str], Doc]:
    """The rendered ConfigMaps, plus the Secrets the operator created from the template
    with real values, and the credential keys the configs need."""
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] == "ConfigMap"}
    # Generated ConfigMaps are referenced by their hashed name, as rendered.
    for template in yaml.safe_load_all((DEPLOY / "base" / "secret.example.yaml").read_text()):
        if template["kind"] != "Secret":
            continue
        secret = copy.deepcopy(template)
        if secret.get("type") == "kubernetes.io/tls":
            server = issue(make_ca("walkthrough server CA"), "authn-gateway", server=True)
            secret["stringData"] = {
                "tls.crt": server.cert_pem().decode(),
                "tls.key": server.key_pem().decode(),
            }
        else:
            keys = set(secret["stringData"]) | extra_keys
            secret["stringData"] = {k: secret_value(k).decode() for k in keys}
        objects[("Secret", secret["metadata"]["name"])] = secret
    return objects


def check_config_in_pod(overlay: str, text: str, needed: set[str], tmp_path: Path) -> str:
    """Run ``authn-gateway check-config`` on ``text`` inside the pod of ``overlay``: its
    mounts written under ``tmp_path``, the paths in ``text`` moved there, its environment
    set. ``needed``: the keys of the authn-gateway Secret the config reads. Returns
    check-config's output; fails the test, with check-config's stderr, if it refuses."""
    docs = render(overlay)
    pod, ctr = container(docs)
    objects = cluster_objects(docs, needed)
    mounts = kubelet.mounts(pod, ctr, objects)
    root = tmp_path / "pod"
    kubelet.materialize(root, mounts)
    config = root / "gateway.yaml"
    config.write_text(kubelet.under_root(text, root, mounts))
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **kubelet.environment(ctr, objects)},
        timeout=60,
    )
    assert result.returncode == 0, f"{overlay}: {result.stderr}"
    return result.stdout
