"""Identity backends, and the leaf modules they share (base, settings, http, budget,
flight, registry). Nothing here imports :mod:`authn_gateway`.

Each backend module registers its settings class (:mod:`backends.registry`);
:func:`load_builtin` imports them, in the order the config's error messages list them.
"""

from __future__ import annotations

import importlib

BUILTIN = ("static", "userinfo", "keystone", "ldap", "gitlab")


def load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(f"{__name__}.{module}")
