"""JWT/OIDC tokens verified locally against the issuer's keys (kube's JWT authenticator shape)."""

from .backend import JWTBackend, JWTSettings

__all__ = ["JWTBackend", "JWTSettings"]
