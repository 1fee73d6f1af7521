"""Observability: metrics, the review and audit logs, readiness, loop lag."""
