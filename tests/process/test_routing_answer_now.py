"""Cache hits answered at once through a chain of backends and the audience check: the
review, run eagerly as the edge runs it, finishes without waiting exactly when every
backend it asks has a fresh local entry, and is counted once either way. Gateways built
from config in process over real fake IdPs (loopback sockets), and one ``authn-gateway
serve`` over a socket."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.support.edge_answer_at_once_helpers import body, connect
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import metric_value, start_gateway
from tests.support.rawhttp import request
from tests.support.routing_answer_now_helpers import chain_config


def test_chain_hits_are_answered_at_once_and_counted_once_per_member(
    fake_idp: FakeIdP, second_idp: FakeIdP, tmp_path: Path
) -> None:
    # The first rejects (cached), the second authenticates (cached): every hit asks
    # both, as the chain's review does, and counts each once.
    fake_idp.configure(status=401)
    gw = start_gateway(chain_config(fake_idp, second_idp), tmp_path)
    try:
        sock, reader = connect(gw)
        with sock:
            answers = []
            for _ in range(4):
                sock.sendall(request(body("good-dave")))
                answers.append(reader.response())
        for answer in answers:
            assert answer is not None and answer[0] == 200
            assert json.loads(answer[2])["status"]["user"]["username"] == "dave"
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        count = "authn_gateway_cache_lookups_total"
        assert metric_value(metrics, count, backend="first", result="negative_hit") == 3
        assert metric_value(metrics, count, backend="second", result="hit") == 3
        assert (fake_idp.calls, second_idp.calls) == (1, 1)
    finally:
        gw.stop()
