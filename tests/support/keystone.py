"""A private Keystone 22 (Debian's ``keystone`` package) on a free loopback port.

Everything lives in one temporary directory: keystone.conf, the sqlite database (WAL
mode: Keystone's sqlite access fails under concurrent writers otherwise), fernet and
credential keys, logs and locks. The WSGI app ``keystone-wsgi-public`` is served by
uWSGI with single-threaded workers (sqlite and Keystone's session handling do not
survive threads). Users, projects, roles and groups are then made through the API.

Starting takes 20-30 s (``db_sync`` dominates), so tests share one instance.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import free_port

KEYSTONE_MANAGE = "/usr/bin/keystone-manage"
WSGI_APP = "/usr/bin/keystone-wsgi-public"
UWSGI = "/usr/bin/uwsgi"
ADMIN_PASSWORD = "AdminPass-test-only"


class KeystoneUnavailable(RuntimeError):
    """The Debian packages are missing or Keystone would not start."""


def _require_binaries() -> None:
    missing = [p for p in (KEYSTONE_MANAGE, WSGI_APP, UWSGI) if not os.access(p, os.X_OK)]
    if not Path("/usr/lib/uwsgi/plugins/python3_plugin.so").exists():
        missing.append("/usr/lib/uwsgi/plugins/python3_plugin.so")
    if missing:
        raise KeystoneUnavailable(
            "Keystone tests need the Debian packages keystone, uwsgi and "
            f"uwsgi-plugin-python3 (scripts/test.sh installs them); missing: {', '.join(missing)}"
        )


CONF = """\
[DEFAULT]
log_dir = {d}/log
log_file = keystone.log
use_stderr = false
[oslo_concurrency]
lock_path = {d}/lock
[database]
connection = sqlite:///{d}/keystone.db
[token]
provider = fernet
expiration = 3600
[fernet_tokens]
key_repository = {d}/fernet-keys
[fernet_receipts]
key_repository = {d}/fernet-keys
[credential]
key_repository = {d}/credential-keys
[cache]
enabled = false
"""


@dataclass
class Keystone:
    workdir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    _admin_token: str | None = field(default=None, repr=False)
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    @property
    def conf(self) -> Path:
        return self.workdir / "keystone.conf"

    # --- processes -------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        log = (self.workdir / "log" / "uwsgi.log").open("ab")
        self.proc = subprocess.Popen(
            [
                UWSGI,
                "--plugin", "python3",
                "--http-socket", f"127.0.0.1:{self.port}",
                "--wsgi-file", WSGI_APP,
                "--master", "--processes", "2", "--threads", "1",
                "--lazy-apps", "--need-app", "--die-on-term",
                "--buffer-size", "65535",
                "--env", f"OS_KEYSTONE_CONFIG_FILES={self.conf}",
                "--chdir", str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            # Own process group: stop() can end the master and its workers together.
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise KeystoneUnavailable(f"uWSGI exited with {code}:\n{self.log()}")
            try:
                if httpx.get(self.url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise KeystoneUnavailable(f"Keystone not answering after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def log(self, tail: int = 40) -> str:
        lines: list[str] = []
        for name in ("uwsgi.log", "keystone.log"):
            path = self.workdir / "log" / name
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()[-tail:]
        return "\n".join(lines)

    def requests_served(self) -> int:
        """Keystone's own count of the requests it answered: uWSGI's request log (one
        ``... GET /v3/auth/tokens => generated ...`` line per request), not a proxy's."""
        path = self.workdir / "log" / "uwsgi.log"
        if not path.exists():
            return 0
        return sum(
            " => generated " in line for line in path.read_text(errors="replace").splitlines()
        )

    # --- the API -----------------------------------------------------------------------

    def issue(
        self,
        name: str,
        password: str,
        scope: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Log in as ``name``; returns the token and its body."""
        auth: dict[str, Any] = {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {"name": name, "domain": {"id": "default"}, "password": password}
                },
            }
        }
        if scope is not None:
            auth["scope"] = scope
        return self._login({"auth": auth})

    def issue_with_app_credential(self, cred_id: str, secret: str) -> tuple[str, dict[str, Any]]:
        identity = {
            "methods": ["application_credential"],
            "application_credential": {"id": cred_id, "secret": secret},
        }
        return self._login({"auth": {"identity": identity}})

    def _login(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        r = _request("POST", f"{self.url}/auth/tokens?nocatalog=1", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"login failed: {r.status_code} {r.text[:200]}")
        return r.headers["x-subject-token"], r.json()["token"]

    def admin(
        self, method: str, path: str, json: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """Call the API as the bootstrap admin (system scope)."""
        for _ in range(2):
            if self._admin_token is None:
                system = {"system": {"all": True}}
                self._admin_token, _ = self.issue("admin", ADMIN_PASSWORD, system)
            r = _request(
                method,
                f"{self.url}{path}",
                json=json,
                headers={"X-Auth-Token": self._admin_token, **(headers or {})},
            )
            if r.status_code == 401:
                self._admin_token = None
                continue
            if r.status_code >= 400:
                raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
            return r.json() if r.content else None
        raise RuntimeError(f"{method} {path}: admin token refused twice")

    def create(self, kind: str, **attrs: Any) -> str:
        """Create a user/project/group/role and remember its id under its name."""
        body = self.admin("POST", f"/{kind}s", {kind: attrs})
        self.ids[f"{kind}:{attrs['name']}"] = body[kind]["id"]
        return str(body[kind]["id"])

    def role_id(self, name: str) -> str:
        key = f"role:{name}"
        if key not in self.ids:
            roles = self.admin("GET", f"/roles?name={name}")["roles"]
            self.ids[key] = roles[0]["id"] if roles else self.create("role", name=name)
        return self.ids[key]

    def user(self, name: str, password: str, **attrs: Any) -> str:
        return self.create("user", name=name, password=password, domain_id="default", **attrs)

    def grant_project(self, user_id: str, project_id: str, role: str) -> None:
        self.admin("PUT", f"/projects/{project_id}/users/{user_id}/roles/{self.role_id(role)}")

    def grant_system(self, user_id: str, role: str) -> None:
        self.admin("PUT", f"/system/users/{user_id}/roles/{self.role_id(role)}")

    def add_to_group(self, user_id: str, group_id: str) -> None:
        self.admin("PUT", f"/groups/{group_id}/users/{user_id}")

    def revoke(self, token: str) -> None:
        self.admin("DELETE", "/auth/tokens", headers={"X-Subject-Token": token})

    def update_user(self, user_id: str, **attrs: Any) -> None:
        self.admin("PATCH", f"/users/{user_id}", {"user": attrs})

    def app_credential(
        self, user_id: str, user_token: str, name: str, expires_in: float
    ) -> tuple[str, str]:
        """An application credential that expires in ``expires_in`` seconds (owner-only API)."""
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=expires_in)
        r = httpx.post(
            f"{self.url}/users/{user_id}/application_credentials",
            json={
                "application_credential": {
                    "name": name,
                    "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%f"),
                }
            },
            headers={"X-Auth-Token": user_token},
            timeout=30,
        )
        if r.status_code != 201:
            raise RuntimeError(f"application credential: {r.status_code} {r.text[:200]}")
        cred = r.json()["application_credential"]
        return cred["id"], cred["secret"]


def _request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One API call, sent again (bounded) when Keystone failed it for a passing reason.

    Two uWSGI processes share one sqlite file: a write that races another process's
    write gets "database is locked" (a 500, or a dropped connection); the next try
    goes through.
    """
    for _ in range(5):
        try:
            response = httpx.request(method, url, timeout=30, **kwargs)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            time.sleep(0.5)
            continue
        if response.status_code not in (500, 503):
            return response
        time.sleep(0.5)
    return httpx.request(method, url, timeout=30, **kwargs)


def _manage(workdir: Path, *args: str) -> None:
    result = subprocess.run(
        [KEYSTONE_MANAGE, "--config-file", str(workdir / "keystone.conf"), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if result.returncode != 0:
        raise KeystoneUnavailable(
            f"keystone-manage {args[0]} failed ({result.returncode}):\n{result.stderr[-2000:]}"
        )


def start_keystone(workdir: Path) -> Keystone:
    """Build a fresh Keystone in ``workdir`` and serve it; the caller stops it."""
    _require_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in ("log", "lock", "fernet-keys", "credential-keys"):
        (workdir / sub).mkdir(exist_ok=True)
    (workdir / "keystone.conf").write_text(CONF.format(d=workdir))
    port = free_port()
    user = os.environ.get("USER") or "root"
    owner = ["--keystone-user", user, "--keystone-group", user] if os.getuid() == 0 else []
    _manage(workdir, "db_sync")
    with sqlite3.connect(workdir / "keystone.db") as db:
        # Persistent in the file: readers no longer block the single writer.
        db.execute("PRAGMA journal_mode=WAL")
    _manage(workdir, "fernet_setup", *owner)
    _manage(workdir, "credential_setup", *owner)
    _manage(
        workdir,
        "bootstrap",
        "--bootstrap-password", ADMIN_PASSWORD,
        "--bootstrap-public-url", f"http://127.0.0.1:{port}/v3/",
        "--bootstrap-region-id", "RegionOne",
    )  # fmt: skip
    keystone = Keystone(workdir, port)
    keystone.start()
    return keystone


def cleanup(keystone: Keystone) -> None:
    keystone.stop()
    shutil.rmtree(keystone.workdir / "fernet-keys", ignore_errors=True)
