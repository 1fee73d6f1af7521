"""A private redis-server on a free loopback port, which tests can stop and restart."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.procs import free_port, wait_for_port


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> RedisServer:
        args = [
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--loglevel",
            "warning",
        ]
        self.proc = subprocess.Popen(
            [self.binary, *args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


class RedisSentinel:
    """One sentinel watching a master, on a free port: ``redis-server --sentinel``."""

    def __init__(self, workdir: Path, master: RedisServer, name: str = "mymaster") -> None:
        self.workdir = workdir
        self.master = master
        self.name = name
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisSentinel:
        conf = self.workdir / f"sentinel-{self.port}.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.name} 1000\n"
        )
        self.proc = subprocess.Popen(
            [self.master.binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisClusterNodes:
    """A three-master Redis Cluster on free ports, created with ``redis-cli --cluster``."""

    def __init__(self, workdir: Path) -> None:
        self.nodes = [RedisServer(workdir / f"node{i}", cluster_port()) for i in range(3)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterNodes:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (Debian package redis-tools)")
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            node.start(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(node.workdir / "nodes.conf"),
            )
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for _ in range(100):
            info = subprocess.run(
                [cli, "-p", str(self.nodes[0].port), "cluster", "info"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            if "cluster_state:ok" in info:
                return self
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not become ready")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
