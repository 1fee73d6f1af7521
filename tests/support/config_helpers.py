"""Helpers shared by the tiers of test_config."""

from __future__ import annotations

MINIMAL = """
backends:
  - name: demo
    type: static
    tokens: [{token: t, username: u}]
"""

STRONG = "test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"
