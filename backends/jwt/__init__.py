"""JWT/OIDC tokens verified locally against the issuer's keys (kube's JWT authenticator shape)."""

from backends.jwt.backend import JWTBackend, JWTSettings

__all__ = ["JWTBackend", "JWTSettings"]
