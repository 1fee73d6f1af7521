"""A connection's cost is bounded whatever it sends, over real sockets to a real
``authn-gateway serve`` process (issue 29): a client that pipelines requests and never
reads the answers (reviews, reviews refused 401, ``/healthz`` on the ops port) keeps
the server's RSS within the bound docs/operations.md states and is cut off after the
send timeout while another client's reviews are answered; a review whose fields have
the wrong JSON types is a 400 naming the field however it arrives; a client that
half-closes after its request still gets its answer."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from loadtests.pipeflood import CALLER_TOKEN, FLOODS, ops_port
from loadtests.pipeflood import config as flood_config
from tests.support.edge_bound_helpers import assert_no_traceback, started
from tests.support.flood import flood
from tests.support.procs import metric_value, review_body, start_gateway

# docs/operations.md ("Connections and timeouts"): what one connection may cost the
# process with the default limits, whatever it sends.
BOUND_PER_CONNECTION_KIB = 200

SEND_TIMEOUT = 1.5


# The flooding client and the gateway each take a core for a few seconds: run alone
# (scripts/test.sh), so neither starves the timing of tests beside them.
@pytest.mark.exclusive
@pytest.mark.parametrize("name", ["review", "review-401", "ops-healthz"])
def test_a_client_that_pipelines_and_never_reads_is_bounded_and_cut_off(
    tmp_path: Path, name: str
) -> None:
    request_bytes, callers, on_ops = FLOODS[name]
    connections = 2
    gw = started(
        start_gateway(flood_config(callers, connections, SEND_TIMEOUT), tmp_path, name=name)
    )
    try:
        headers = {"authorization": f"Bearer {CALLER_TOKEN}"} if callers else {}
        client = httpx.Client(timeout=5, headers=headers)

        def other() -> None:
            answer = client.post(f"{gw.url}/authenticate", json=review_body("t" * 16))
            assert answer.status_code == 200 and answer.json()["status"]["authenticated"], (
                answer.status_code,
                answer.text,
            )

        other()
        time.sleep(1)
        port = ops_port(gw.logs()) if on_ops else gw.port
        result = flood(
            port, request_bytes, gw.proc.pid, 12, connections, other, receive_buffer=4096
        )
        client.close()
        summary = result.summary()
        # Every flooding connection was cut off by the send timeout...
        assert all(closed is not None for closed in result.closed_after), summary
        # ...memory stayed within the bound meanwhile...
        assert result.growth_kib <= connections * BOUND_PER_CONNECTION_KIB, summary
        # ...and another client's reviews were answered all along.
        assert not result.failures and len(result.latencies) > 20, summary
        assert max(result.latencies) < 2.0, summary
        text = httpx.get(f"http://127.0.0.1:{ops_port(gw.logs())}/metrics", timeout=5).text
        listener = "ops" if on_ops else "review"
        cut = metric_value(
            text, "authn_gateway_request_timeouts_total", listener=listener, phase="send"
        )
        assert cut >= connections, summary
        assert_no_traceback(gw)
    finally:
        gw.stop()
