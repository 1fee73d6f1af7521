"""The load harness: kube-apiserver's retry policy, the fake Keystone, and a bounded run.

Figures are printed by the harness, never asserted here (2 shared cores).
"""

from __future__ import annotations

from pathlib import Path

from loadtests.run import start_passthrough
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP


def test_the_passthrough_webhook_calls_the_idp_for_every_review(
    fake_idp: FakeIdP, tmp_path: Path
) -> None:
    # The scenarios' "without the gateway" side (loadtests.run): no cache, no breaker,
    # so every review is an IdP call and an outage reaches every review.
    naive = start_passthrough({"backends": [userinfo_backend(fake_idp)]}, tmp_path, "naive")
    try:
        for _ in range(3):
            answer = naive.review("good-alice").json()["status"]
            assert answer["authenticated"] is True and answer["user"]["username"] == "alice"
        assert naive.review("bad-token").json()["status"] == {"authenticated": False}
        assert fake_idp.calls == 4
        fake_idp.configure(status=500)
        for _ in range(5):
            answer = naive.review("good-alice").json()["status"]
            assert answer["authenticated"] is False and "answered 500" in answer["error"]
        assert fake_idp.calls == 9  # every one of them, breaker or not
    finally:
        naive.stop()
