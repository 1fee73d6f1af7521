"""authn-gateway: a Kubernetes TokenReview webhook in front of identity providers."""

__version__ = "0.1.0"
