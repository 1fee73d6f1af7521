"""Example counts for property-based tests whose examples are slow (a real server over
a socket): scaled with the hypothesis profile tests/conftest.py loads (``ci`` by
default, ``HYPOTHESIS_PROFILE=long`` by hand), like the fast tests' counts."""

from __future__ import annotations

from hypothesis import settings

#: The ci profile's max_examples (tests/conftest.py).
CI_EXAMPLES = 100


def examples(ci: int) -> int:
    """``ci`` examples in the ci profile, as many times more as the loaded profile has."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)
