"""The container image's build steps, short of Docker (no engine runs here).

deploy/Dockerfile copies a chosen set of files into its build stage and installs
them with pip. This builds a wheel from exactly those files, installs it apart from
the checkout, and runs the installed gateway, so a missing COPY (a module, the
embedded default config) fails here rather than in a cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_stage_sources() -> list[str]:
    sources: list[str] = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM") and sources:
            break  # the runtime stage copies from the build stage only
        if line.startswith("COPY ") and "--from" not in line:
            *srcs, _dest = line.split()[1:]
            sources += srcs
    return sources


def test_the_image_build_stage_installs_a_working_gateway(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for source in build_stage_sources():
        src, dst = ROOT / source, context / source
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(
                src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(src, dst)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(context)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = list(wheels.glob("authn_gateway-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "authn_gateway/default.yaml",
        "authn_gateway/review/pipeline.py",
        "authn_gateway/review/stores.py",
        "authn_gateway/layers/bucket/gcra_take.lua",
        "backends/keystone/backend.py",
        "backends/ldap/backend.py",
        "backends/gitlab.py",
        "backends/static.py",
    ):
        assert module in names, f"{module} missing from the image's package"

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Run from outside the checkout, so the installed copy is what gets imported.
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import authn_gateway; print(authn_gateway.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target))
    review = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "review"],
        input="demo-dev-token\n",
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert review.returncode == 0, review.stderr
    assert '"username": "demo-dev"' in review.stdout
