"""The backends' HTTP client does no avoidable work per IdP call.

httpcore (1.0) runs ``import sniffio`` inside every lock's setup, four times a request.
Without sniffio installed each of those imports fails only after a search of sys.path
(a fifth of an httpx call's CPU, docs/decisions.md): a call must import nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

from backends.http import TLSClientSettings, make_client
from backends.settings import TimeoutSettings
from tests.support.fakes.idp import FakeIdP


class CountingFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: sees every import of a module not yet in sys.modules."""

    def __init__(self) -> None:
        self.searched: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        self.searched.append(fullname)
        return None  # let the real finders do it


async def test_an_idp_call_searches_for_no_module(fake_idp: FakeIdP) -> None:
    client = make_client(fake_idp.url, TimeoutSettings(), TLSClientSettings())
    try:
        first = await client.get("", headers={"Authorization": "Bearer good-warm"})
        assert first.status_code == 200  # whatever a first call imports, it has now
        finder = CountingFinder()
        sys.meta_path.insert(0, finder)
        try:
            for i in range(5):
                answer = await client.get("", headers={"Authorization": f"Bearer good-user{i}"})
                assert answer.status_code == 200
        finally:
            sys.meta_path.remove(finder)
    finally:
        await client.aclose()
    assert finder.searched == []
    assert fake_idp.stats().calls == 6
