"""kube-apiserver's validation of the objects deploy/ ships, encoded in Python.

No kube-apiserver can run where the tests run, so the rules that apply to our objects
are written out here, each function naming the Kubernetes source it follows. An
object is defaulted first (as the apiserver does before validating), then validated;
the result is kube's error lines, ``<field path>: <message>``, empty when it would be
admitted. :func:`validate` dispatches on the object's kind.
"""

from __future__ import annotations

from .dispatch import validate

__all__ = ["validate"]
