"""Strategies and example counts for the property-based tests: any JSON, documents shaped
like a TokenReview, and the example count of a test whose examples are slow (a real
server over a socket), scaled with the hypothesis profile tests/conftest.py loads (``ci`` by
default, ``HYPOTHESIS_PROFILE=long`` by hand), like the fast tests' counts."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st

#: The ci profile's max_examples (tests/conftest.py).
CI_EXAMPLES = 100


def examples(ci: int) -> int:
    """``ci`` examples in the ci profile, as many times more as the loaded profile has."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)


V1 = "authentication.k8s.io/v1"
V1BETA1 = "authentication.k8s.io/v1beta1"
#: Any JSON document, the review's own strings among the leaves.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from([V1, V1BETA1, "TokenReview", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
# Documents shaped like a review, with any JSON in any field: where the bugs were.
REVIEWS = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": JSON,
        "kind": JSON,
        "spec": JSON | st.fixed_dictionaries({}, optional={"token": JSON, "audiences": JSON}),
    },
)
