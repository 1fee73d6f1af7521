"""Serving: the ASGI app, the review endpoint, the ops and admin APIs, reloads."""
