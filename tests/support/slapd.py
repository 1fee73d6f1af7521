"""A private OpenLDAP server for the tests, on free loopback ports.

Everything it needs is built from scratch in a temporary directory:

* a test CA and a server certificate for 127.0.0.1 (the ``openssl`` CLI), plus a
  second, unrelated CA to show that verification fails with the wrong one;
* its own ``cn=config``, loaded with ``slapadd -n0``: the core, cosine, nis and
  inetorgperson schemas, an mdb database, the ``memberof`` overlay and TLS;
* a directory of users and groups, added with ``ldapadd`` through the running
  server so that the memberof overlay fills in ``memberOf``;
* ``cn=Monitor``, whose operation counters :meth:`Slapd.operations` reads.

The server runs in the foreground (``-d 0``) as a child of the test process, so a
test can stop it and start it again on the same ports, with the same data.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from .procs import free_port, wait_for_port

SUFFIX = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "admin-secret"
SERVICE_DN = f"cn=gateway,ou=services,{SUFFIX}"
SERVICE_PASSWORD = "service-secret"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
POSIX_GROUPS = f"ou=posix,{SUFFIX}"

SCHEMAS = ("core", "cosine", "nis", "inetorgperson")
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")


@dataclass(frozen=True)
class DirectoryUser:
    uid: str
    password: str
    # The RDN value exactly as it appears in the DN (already RFC 4514 escaped).
    rdn_value: str
    uid_number: int
    mail: str
    groups: tuple[str, ...] = ()
    posix_groups: tuple[str, ...] = ()
    cn: str = ""

    @property
    def dn(self) -> str:
        return f"uid={self.rdn_value},{PEOPLE}"


USERS = {
    u.uid: u
    for u in (
        DirectoryUser("alice", "alice-pw", "alice", 10001, "alice@example.org",
                      groups=("admins", "developers", "viewers"), posix_groups=("ops",)),
        DirectoryUser("bob", "bob:pw:with:colons", "bob", 10002, "bob@example.org",
                      groups=("developers",), posix_groups=("ops", "oncall")),
        DirectoryUser("carol", "carol-pw", "carol", 10003, "carol@example.org"),
        # A uid full of RFC 4514 metacharacters: escaping must find her, and only her.
        DirectoryUser("ann,lee+x=1", "ann-pw", "ann\\,lee\\+x\\=1", 10004, "ann@example.org",
                      groups=("viewers",)),
        # A uid with a filter metacharacter: "star*" must match her, "*" nobody.
        DirectoryUser("star*", "star-pw", "star*", 10005, "star@example.org"),
        # Two entries with one cn: a filter on cn matches both, so neither may log in.
        DirectoryUser("twin-a", "twin-a-pw", "twin-a", 10006, "twin-a@example.org", cn="twin"),
        DirectoryUser("twin-b", "twin-b-pw", "twin-b", 10007, "twin-b@example.org", cn="twin"),
    )
}  # fmt: skip

# Group name -> members' uids; groupOfNames needs at least one member.
GROUP_MEMBERS = {
    "admins": ("alice",),
    "developers": ("alice", "bob"),
    "viewers": ("alice", "ann,lee+x=1"),
}
POSIX_GROUP_MEMBERS = {"ops": ("alice", "bob"), "oncall": ("bob",)}


class MissingBinary(RuntimeError):
    pass


def _binary(name: str) -> str:
    # /usr/sbin is not on every PATH (slapd, slapadd live there).
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise MissingBinary(
            f"{name} not found: the LDAP tests need the Debian packages slapd, ldap-utils "
            "and openssl (./scripts/test.sh installs them)"
        )
    return found


def _run(args: list[str], what: str, stdin: str | None = None) -> None:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


# --- certificates -------------------------------------------------------------------


@dataclass(frozen=True)
class CertificateAuthority:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ServerCertificate:
    cert: Path
    key: Path


def make_ca(directory: Path, name: str) -> CertificateAuthority:
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(directory / f"{name}.pem", directory / f"{name}.key")
    _run(
        [_binary("openssl"), "req", "-x509", "-newkey", "ec",
         "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(ca.key), "-out", str(ca.cert), "-days", "3",
         "-subj", f"/CN=authn-gateway {name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        f"creating test CA {name}",
    )  # fmt: skip
    return ca


def issue_server_cert(ca: CertificateAuthority, directory: Path) -> ServerCertificate:
    server = ServerCertificate(directory / "server.pem", directory / "server.key")
    csr = directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
    )
    openssl = _binary("openssl")
    _run(
        [openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(server.key), "-out", str(csr), "-subj", "/CN=127.0.0.1"],
        "creating the server key",
    )  # fmt: skip
    _run(
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
         "-set_serial", "2", "-days", "3", "-extfile", str(ext), "-out", str(server.cert)],
        "signing the server certificate",
    )  # fmt: skip
    return server


# --- directory content --------------------------------------------------------------


def seed_ldif() -> str:
    """The organisation, the gateway's service account, users, and both kinds of group."""
    parts = [
        f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\n"
        "o: Example\n",
        *(
            f"dn: ou={ou},{SUFFIX}\nobjectClass: organizationalUnit\nou: {ou}\n"
            for ou in ("people", "groups", "posix", "services")
        ),
        f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
        f"cn: gateway\nuserPassword: {SERVICE_PASSWORD}\n",
    ]
    for u in USERS.values():
        parts.append(
            f"dn: {u.dn}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            f"uid: {u.uid}\ncn: {u.cn or u.uid}\nsn: {u.uid}\nmail: {u.mail}\n"
            f"uidNumber: {u.uid_number}\ngidNumber: 10000\nhomeDirectory: /home/{u.uid_number}\n"
            f"userPassword: {u.password}\n"
        )
    for group, members in GROUP_MEMBERS.items():
        lines = "".join(f"member: {USERS[m].dn}\n" for m in members)
        parts.append(f"dn: cn={group},{GROUPS}\nobjectClass: groupOfNames\ncn: {group}\n{lines}")
    for gid, (group, members) in enumerate(POSIX_GROUP_MEMBERS.items(), start=20000):
        lines = "".join(f"memberUid: {m}\n" for m in members)
        parts.append(
            f"dn: cn={group},{POSIX_GROUPS}\nobjectClass: posixGroup\ncn: {group}\n"
            f"gidNumber: {gid}\n{lines}"
        )
    return "\n".join(parts)


def config_ldif(data_dir: Path, run_dir: Path, server: ServerCertificate, ca: Path) -> str:
    schemas = "\n".join(f"include: file://{SCHEMA_DIR / s}.ldif" for s in SCHEMAS)
    return textwrap.dedent(
        f"""\
        dn: cn=config
        objectClass: olcGlobal
        cn: config
        olcPidFile: {run_dir}/slapd.pid
        olcArgsFile: {run_dir}/slapd.args
        olcTLSCACertificateFile: {ca}
        olcTLSCertificateFile: {server.cert}
        olcTLSCertificateKeyFile: {server.key}
        # Like many real servers: a bind with a DN and an empty password "succeeds"
        # (as anonymous). The gateway must never send one.
        olcAllows: bind_anon_dn

        dn: cn=module{{0}},cn=config
        objectClass: olcModuleList
        cn: module{{0}}
        olcModulePath: {MODULE_DIR}
        olcModuleLoad: back_mdb
        olcModuleLoad: memberof

        dn: cn=schema,cn=config
        objectClass: olcSchemaConfig
        cn: schema

        {{schemas}}

        dn: olcDatabase={{-1}}frontend,cn=config
        objectClass: olcDatabaseConfig
        objectClass: olcFrontendConfig
        olcDatabase: {{-1}}frontend
        olcSizeLimit: 500

        dn: olcDatabase={{0}}config,cn=config
        objectClass: olcDatabaseConfig
        olcDatabase: {{0}}config
        olcAccess: {{0}}to * by * none

        dn: olcDatabase={{1}}mdb,cn=config
        objectClass: olcDatabaseConfig
        objectClass: olcMdbConfig
        olcDatabase: {{1}}mdb
        olcDbDirectory: {data_dir}
        olcDbMaxSize: 67108864
        olcSuffix: {SUFFIX}
        olcRootDN: {ADMIN_DN}
        olcRootPW: {ADMIN_PASSWORD}
        # Anonymous users may only bind; searching needs a bound identity.
        olcAccess: {{0}}to attrs=userPassword by anonymous auth by * none
        olcAccess: {{1}}to * by users read by * none

        # cn=Monitor: the server's own operation counters, for tests that assert how
        # many binds and searches really reached it. Only the admin may read them.
        dn: olcDatabase={{2}}monitor,cn=config
        objectClass: olcDatabaseConfig
        olcDatabase: {{2}}monitor
        olcAccess: {{0}}to * by dn.exact="{ADMIN_DN}" read by * none

        dn: olcOverlay={{0}}memberof,olcDatabase={{1}}mdb,cn=config
        objectClass: olcOverlayConfig
        objectClass: olcMemberOf
        olcOverlay: {{0}}memberof
        olcMemberOfRefInt: TRUE
        olcMemberOfGroupOC: groupOfNames
        olcMemberOfMemberAD: member
        olcMemberOfMemberOfAD: memberOf
        """
    ).replace("{schemas}", schemas)


# --- the server ---------------------------------------------------------------------


@dataclass
class Slapd:
    """One private slapd: ldap:// (StartTLS capable) and ldaps:// on loopback."""

    workdir: Path
    ca: CertificateAuthority
    ldap_port: int = field(default_factory=free_port)
    ldaps_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _monitor_reads: int = 0

    @property
    def ldap_url(self) -> str:
        return f"ldap://127.0.0.1:{self.ldap_port}"

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://127.0.0.1:{self.ldaps_port}"

    @property
    def config_dir(self) -> Path:
        return self.workdir / "slapd.d"

    @property
    def log_path(self) -> Path:
        return self.workdir / "slapd.log"

    def build(self) -> None:
        """Write cn=config with slapadd -n0 and create the empty database."""
        data_dir, run_dir = self.workdir / "data", self.workdir / "run"
        for d in (self.config_dir, data_dir, run_dir):
            d.mkdir(parents=True, exist_ok=True)
        server = issue_server_cert(self.ca, self.workdir)
        for schema in SCHEMAS:
            if not (SCHEMA_DIR / f"{schema}.ldif").is_file():
                raise MissingBinary(f"{SCHEMA_DIR}/{schema}.ldif not found: install slapd")
        _run(
            [_binary("slapadd"), "-n0", "-F", str(self.config_dir)],
            "slapadd -n0 (cn=config)",
            stdin=config_ldif(data_dir, run_dir, server, self.ca.cert),
        )

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        urls = f"{self.ldap_url}/ {self.ldaps_url}/"
        self._monitor_reads = 0  # the counters start again with the process
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                # -d 0: stay in the foreground, under the test's control, and log nothing.
                [_binary("slapd"), "-d", "0", "-h", urls, "-F", str(self.config_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_port(self.ldap_port, proc=self.proc)
            wait_for_port(self.ldaps_port, proc=self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"slapd did not start:\n{self.log_path.read_text()}") from None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def operations(self, kind: str = "Bind") -> int:
        """Operations of ``kind`` (Bind, Search, ...) the server has completed since it
        started, from its own cn=Monitor, not counting the bind and search that each of
        these queries makes itself."""
        earlier = self._monitor_reads
        self._monitor_reads += 1
        done = subprocess.run(
            [_binary("ldapsearch"), "-x", "-LLL", "-H", self.ldap_url, "-D", ADMIN_DN,
             "-w", ADMIN_PASSWORD, "-b", f"cn={kind},cn=Operations,cn=Monitor", "-s", "base",
             "monitorOpCompleted"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        for line in done.stdout.splitlines():
            if line.startswith("monitorOpCompleted:"):
                count = int(line.split(":", 1)[1])
                # Earlier reads made a bind and a search each; this one's bind is done,
                # its search still running.
                own = {"Bind": earlier + 1, "Search": earlier}.get(kind, 0)
                return count - own
        raise RuntimeError(f"no monitorOpCompleted for {kind}:\n{done.stdout}{done.stderr}")

    def add(self, ldif: str) -> None:
        _run(
            [_binary("ldapadd"), "-x", "-H", self.ldap_url, "-D", ADMIN_DN, "-w", ADMIN_PASSWORD],
            "ldapadd",
            stdin=ldif,
        )


def start_slapd(workdir: Path, ca: CertificateAuthority) -> Slapd:
    """Build, start and seed a slapd in ``workdir``; the caller stops it."""
    server = Slapd(workdir, ca)
    server.build()
    server.start()
    try:
        server.add(seed_ldif())
    except Exception:
        server.stop()
        raise
    return server
