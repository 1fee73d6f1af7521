"""``user.extra`` markers: which backend vouched for an identity, and whether stale.

kube-apiserver hands a TokenReview's ``user.extra`` to authorization webhooks and to
admission (``request.userInfo.extra`` in a ValidatingAdmissionPolicy), so the
cluster can treat an identity served from cache during an IdP outage differently,
for example read-only (deploy/policy/).

Keys under the gateway's prefix are the gateway's alone: whatever a backend put
there (an LDAP attribute, a userinfo claim an IdP user can edit) is dropped, so no
one can mark a stale identity as fresh.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import UserInfo

TRUE = ("true",)


class Markers:
    def __init__(self, prefix: str, stale: bool, backend: bool) -> None:
        self.prefix = prefix
        self.stale_key = prefix + "stale"
        self.backend_key = prefix + "backend"
        self._stale = stale
        self._backend = backend
        self.enabled = stale or backend
        # One tuple per backend name, made once: this runs on every authenticated answer.
        self._names: dict[str, tuple[str, ...]] = {}

    def user_extra(
        self, user: UserInfo, backend: str, stale: bool
    ) -> Mapping[str, tuple[str, ...]]:
        """The ``extra`` to send for ``user``, as decided by ``backend``."""
        if not self.enabled:
            return user.extra
        extra = {k: v for k, v in user.extra.items() if not k.startswith(self.prefix)}
        if self._backend:
            name = self._names.get(backend)
            if name is None:
                name = self._names[backend] = (backend,)
            extra[self.backend_key] = name
        if self._stale and stale:
            extra[self.stale_key] = TRUE
        return extra


NONE = Markers("", stale=False, backend=False)
