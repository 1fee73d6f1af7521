"""What a container of a rendered pod template sees: its mounted files and environment.

Kubelet projects each volume a container mounts into the container's filesystem (a
ConfigMap's or Secret's keys as files, or only ``items`` under their ``path``; an
emptyDir as an empty writable directory) and resolves ``env`` (``value`` or
``valueFrom.secretKeyRef``). This does the same under a scratch root, from the objects
deploy/ renders plus the Secrets an operator creates, so that a config can be checked
where the pod would read it.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

Doc = dict[str, Any]


@dataclass(frozen=True)
class Mount:
    path: PurePosixPath
    writable: bool
    #: The files the volume holds, relative to the mount (empty for an emptyDir).
    files: dict[str, bytes]


def _data(doc: Doc) -> dict[str, bytes]:
    """A Secret's data (base64) and stringData, or a ConfigMap's data and binaryData."""
    if doc["kind"] == "ConfigMap":
        data = {k: v.encode() for k, v in (doc.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (doc.get("binaryData") or {}).items()})
        return data
    data = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (doc.get("stringData") or {}).items()})
    return data


def mounts(pod: Doc, container: Doc, objects: dict[tuple[str, str], Doc]) -> list[Mount]:
    """The container's mounts. ``objects`` maps (kind, name) to ConfigMaps and Secrets;
    a missing one raises, as kubelet would fail to start the pod."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    result = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            files: dict[str, bytes] = {}
            writable = True
        else:
            kind, ref = (
                ("ConfigMap", volume["configMap"]["name"])
                if "configMap" in volume
                else ("Secret", volume["secret"]["secretName"])
            )
            source = volume.get("configMap") or volume["secret"]
            if (kind, ref) not in objects:
                raise LookupError(f"volume {mount['name']}: {kind} {ref} does not exist")
            data = _data(objects[(kind, ref)])
            items = source.get("items")
            files = {i["path"]: data[i["key"]] for i in items} if items else data
            writable = False
        result.append(Mount(PurePosixPath(mount["mountPath"]), writable, files))
    return result


def environment(container: Doc, objects: dict[tuple[str, str], Doc]) -> dict[str, str]:
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        env[var["name"]] = _data(objects[("Secret", ref["name"])])[ref["key"]].decode()
    return env


def materialize(root: Path, pod_mounts: list[Mount]) -> None:
    """Write the mounts under ``root`` (``/etc/x`` becomes ``root/etc/x``)."""
    for mount in pod_mounts:
        base = root / mount.path.relative_to("/")
        base.mkdir(parents=True, exist_ok=True)
        for name, content in mount.files.items():
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_bytes(content)


def under_root(text: str, root: Path, pod_mounts: list[Mount]) -> str:
    """``text`` with every path under a mount moved under ``root``, in one pass (the
    root may itself lie under a mount path such as /tmp)."""
    paths = sorted((str(m.path) for m in pod_mounts), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w/.-])(" + "|".join(re.escape(p) for p in paths) + ")/")
    return pattern.sub(lambda m: f"{root}{m.group(1)}/", text)


def mount_of(path: str, pod_mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` lies under, if any."""
    target = PurePosixPath(path)
    for mount in pod_mounts:
        if mount.path in target.parents:
            return mount
    return None
