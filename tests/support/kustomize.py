"""Render deploy/ with the real ``kubectl kustomize``, as ``kubectl apply -k`` would."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"

#: Every kustomization deploy/ ships, as the docs tell an operator to apply it.
OVERLAYS = ("base", "overlays/redis", "overlays/redis-sentinel", "overlays/two-clusters", "policy")
#: The gateway's own overlays (the ones that run the Deployment and its config).
GATEWAY_OVERLAYS = ("base", "overlays/redis", "overlays/redis-sentinel", "overlays/two-clusters")

Doc = dict[str, Any]


@dataclass(frozen=True)
class Rendering:
    docs: tuple[Doc, ...]
    #: What kustomize printed on stderr: its warnings ("# Warning: 'bases' is deprecated").
    stderr: str


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is required to render deploy/ (Debian: apt-get install kubernetes-client; "
            "scripts/test.sh installs it)"
        )
    return path


@cache
def kustomize(directory: str | Path) -> Rendering:
    """``kubectl kustomize DIR``: a directory under deploy/, or any path (a test's overlay)."""
    path = directory if isinstance(directory, Path) else DEPLOY / directory
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d is not None)
    return Rendering(docs, result.stderr)


def render(directory: str | Path) -> tuple[Doc, ...]:
    return kustomize(directory).docs


def find(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    for doc in docs:
        actual = doc["metadata"]["name"]
        # Generated ConfigMaps carry a content hash suffix.
        generated = kind == "ConfigMap" and actual.startswith(name + "-")
        if doc["kind"] == kind and (actual == name or generated):
            return doc
    raise AssertionError(
        f"no {kind} {name} in {[(d['kind'], d['metadata']['name']) for d in docs]}"
    )


def config_of(docs: tuple[Doc, ...]) -> Doc:
    """The gateway.yaml the rendered ConfigMap carries, parsed."""
    cm = find(docs, "ConfigMap", "authn-gateway-config")
    parsed: Doc = yaml.safe_load(cm["data"]["gateway.yaml"])
    return parsed


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
