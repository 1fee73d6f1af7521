"""A fake OIDC issuer that publishes real keys over HTTPS, for the jwt backend.

* ``GET /.well-known/openid-configuration``: discovery (``issuer``, ``jwks_uri``);
* ``GET /keys``: the JWKS of the published keys, with ``Cache-Control: max-age``;
* ``POST /introspect``: RFC 7662 introspection of the opaque tokens in
  :attr:`FakeIssuer.opaque`, for clients that present :attr:`client_credentials`
  with HTTP Basic or in the form (an answer holding ``active`` is sent as it is:
  a server that says active whatever the token's ``exp``);
* :meth:`FakeIssuer.mint` signs tokens with any key it holds, published or not, with
  any header (``alg: none``, HS256 with the public key, a tampered payload...);
  :meth:`FakeIssuer.mint_raw` signs a payload given as bytes (odd keys, any types).

Keys are real RSA, EC and Ed25519 keys; rotation is :meth:`add_key` / :meth:`retire_key`.
TLS uses a CA minted at start (:attr:`ca_pem` is what goes in the gateway's
``issuer.certificateAuthority``). Faults are the fake IdP's (:class:`Faults`: latency,
status, hang, refuse), applied to discovery and JWKS alike; :meth:`stats` counts
calls per path, so tests assert on the issuer's own numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import ssl
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..pki import issue, make_ca
from .idp import FakeIdP, _json, injected_fault

DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/keys"
INTROSPECT_PATH = "/introspect"


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        algo = jwt.get_algorithm_by_name(self.alg)
        jwk: dict[str, Any] = json.loads(algo.to_jwk(self.private.public_key()))
        jwk.update({"kid": self.kid, "use": "sig", "alg": self.alg})
        return jwk


def new_key(kid: str, alg: str = "RS256") -> SigningKey:
    if alg.startswith(("RS", "PS")):
        return SigningKey(kid, alg, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    if alg == "EdDSA":
        return SigningKey(kid, alg, ed25519.Ed25519PrivateKey.generate())
    curves = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1()}
    return SigningKey(kid, alg, ec.generate_private_key(curves[alg]))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def self_signed_tls(host: str) -> tuple[str, ssl.SSLContext]:
    """A CA (PEM, for the gateway) and a server context whose certificate it signed."""
    ca = make_ca("fake issuer CA")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = issue(ca, host, server=True, ip=host).write(Path(tmp), "server")
        ctx.load_cert_chain(cert_path, key_path)
    return ca.cert_pem().decode(), ctx


class FakeIssuer(FakeIdP):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_age: int | None = 300) -> None:
        super().__init__(host, port)
        self.ca_pem, self._tls = self_signed_tls(host)
        # Seconds sent as Cache-Control max-age on the JWKS; None sends no header.
        self.max_age = max_age
        self._keys: dict[str, SigningKey] = {}
        self._published: list[str] = []
        self._path_calls: dict[str, int] = {}
        # Opaque token -> its introspection answer (without "active").
        self.opaque: dict[str, dict[str, Any]] = {}
        self.client_credentials = ("gateway", "introspection-secret")
        # Published after the real keys as they are: malformed entries, to test that
        # one bad key costs only itself.
        self.extra_jwks: list[Any] = []
        self.add_key("key-1")

    # ---- keys and tokens ------------------------------------------------------
    def add_key(self, kid: str, alg: str = "RS256", publish: bool = True) -> SigningKey:
        key = new_key(kid, alg)
        with self._lock:
            self._keys[kid] = key
            if publish:
                self._published.append(kid)
        return key

    def retire_key(self, kid: str) -> None:
        """Stop publishing ``kid``; tokens can still be minted with it (to test refusal)."""
        with self._lock:
            self._published = [k for k in self._published if k != kid]

    def jwks(self) -> dict[str, Any]:
        with self._lock:
            published = [self._keys[k].public_jwk() for k in self._published]
            return {"keys": [*published, *self.extra_jwks]}

    @property
    def issuer(self) -> str:
        return f"https://{self.host}:{self.port}"

    def claims(self, sub: str = "alice", **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        base = {"iss": self.issuer, "sub": sub, "aud": "gateway", "iat": now, "exp": now + 600}
        base.update(extra)
        return base

    def mint(
        self,
        claims: dict[str, Any],
        kid: str = "key-1",
        alg: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> str:
        key = self._keys[kid]
        return jwt.encode(
            claims, key.private, algorithm=alg or key.alg, headers={"kid": kid, **(headers or {})}
        )

    def mint_raw(
        self,
        payload: bytes,
        kid: str | None = "key-1",
        alg: str | None = None,
        headers: dict[str, Any] | None = None,
        signing_kid: str | None = None,
    ) -> str:
        """A token whose payload is exactly ``payload`` (duplicate or odd keys, any JSON
        type anywhere), signed by ``signing_kid`` (default ``kid``) with ``alg``."""
        key = self._keys[signing_kid or kid or "key-1"]
        algorithm = alg or key.alg
        header: dict[str, Any] = {"alg": algorithm, "typ": "JWT", **(headers or {})}
        if kid is not None:
            header.setdefault("kid", kid)
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(payload)}"
        signature = jwt.get_algorithm_by_name(algorithm).sign(signing_input.encode(), key.private)
        return f"{signing_input}.{_b64(signature)}"

    def mint_unsigned(self, claims: dict[str, Any], kid: str = "key-1") -> str:
        """``alg: none``: header and payload, empty signature."""
        header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
        return f"{header}.{_b64(json.dumps(claims).encode())}."

    def mint_hs256_with_public_key(self, claims: dict[str, Any], kid: str = "key-1") -> str:
        """The algorithm-confusion attack: HMAC keyed with the published public key."""
        public_pem = (
            self._keys[kid]
            .private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        payload = _b64(json.dumps(claims).encode())
        sig = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(sig)}"

    # ---- the issuer's HTTP side -------------------------------------------------
    async def _decide(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        path = target.split("?", 1)[0]
        with self._lock:
            self._path_calls[path] = self._path_calls.get(path, 0) + 1
        fault = await injected_fault(self.faults, lambda s: {"error": f"fake issuer answers {s}"})
        if fault is not None:
            return fault
        if path == INTROSPECT_PATH and method == "POST":
            return self._introspect(headers, body)
        if method != "GET":
            return _json(405, {"error": "method not allowed"})
        if path == DISCOVERY_PATH:
            return _json(
                200,
                {
                    "issuer": self.issuer,
                    "jwks_uri": self.issuer + JWKS_PATH,
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                },
            )
        if path == JWKS_PATH:
            extra = {} if self.max_age is None else {"cache-control": f"max-age={self.max_age}"}
            return _json(200, self.jwks(), extra)
        return _json(404, {"error": "not found"})

    def _introspect(
        self, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        form = dict(urllib.parse.parse_qsl(body.decode(errors="replace")))
        client = (form.get("client_id"), form.get("client_secret"))
        auth = headers.get("authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            client = (urllib.parse.unquote(user), urllib.parse.unquote(password))
        if client != self.client_credentials:
            return _json(401, {"error": "invalid_client"}, {"www-authenticate": "Basic"})
        answer = self.opaque.get(form.get("token", ""))
        if answer is not None and "active" in answer:
            return _json(200, answer)  # scripted: a server that answers as told
        if answer is None or answer.get("exp", float("inf")) < time.time():
            return _json(200, {"active": False})
        return _json(200, {"active": True, **answer})

    def path_calls(self, path: str = JWKS_PATH) -> int:
        with self._lock:
            return self._path_calls.get(path, 0)

    def reset_stats(self) -> None:
        super().reset_stats()
        with self._lock:
            self._path_calls = {}

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, reuse_address=True, ssl=self._tls
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def start_in_thread(self) -> FakeIssuer:
        super().start_in_thread()
        return self


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ca-out", type=Path, help="write the CA (PEM) here")
    args = parser.parse_args()
    issuer = FakeIssuer(port=args.port)

    async def forever() -> None:
        await issuer.run()
        if args.ca_out:
            args.ca_out.write_text(issuer.ca_pem)
        print(f"fake issuer at {issuer.issuer}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(forever())


if __name__ == "__main__":
    main()
