"""The innermost layer: each backend call's own deadline, its exception guard, and the
call's metrics (the IdP's time apart from the gateway's own)."""
