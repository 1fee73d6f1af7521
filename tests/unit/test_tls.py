"""The serving edge end to end: TLS, who may call, rotation, reloads, shutdown, workers.

Every test runs real ``authn-gateway serve`` processes on loopback, with
certificates minted here by ``cryptography``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.tls_helpers import STATIC


def test_worker_count_above_one_needs_an_ops_port(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"server": {"workers": 2}, "backends": [STATIC]}))
    from authn_gateway.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="workers: more than 1 needs ops"):
        load_config(path)


def test_allowed_subjects_need_mutual_tls(tmp_path: Path) -> None:
    from authn_gateway.config import ConfigError, load_config

    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"server": {"allowed_subjects": ["kube-apiserver"]}, "backends": [STATIC]})
    )
    with pytest.raises(ConfigError, match=r"allowed_subjects: needs tls\.client_ca_file"):
        load_config(path)
