"""Helpers shared by the tiers of test_breaker_transitions."""

from __future__ import annotations

RESET = 60.0  # reset_timeout: long, so no probe ever comes due by itself during a test
