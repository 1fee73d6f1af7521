"""Helpers shared by the tiers of test_stale_limit."""

from __future__ import annotations

SECRET = "stale-test-only-Vb3Nq8Lm1Zx6Tc4Wr9Ks2Hd7Fj5Gp0Ya"
