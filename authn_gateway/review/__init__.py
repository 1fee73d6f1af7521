"""The review: the TokenReview format, pre-rejection, routing, and each backend's stack."""
