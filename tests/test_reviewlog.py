"""Review log lines: logfmt or JSON, batched, never failing a review."""

from __future__ import annotations

import asyncio
import io
import json

from authn_gateway.reviewlog import ReviewLog


def test_text_lines_are_logfmt_with_quoting() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    log.write(token="abc123", answer="rejected", reason='unknown "static" token', stale=None)
    log.flush()
    assert (
        out.getvalue()
        == 'review token=abc123 answer=rejected reason="unknown \\"static\\" token"\n'
    )


def test_json_lines_parse() -> None:
    out = io.StringIO()
    log = ReviewLog("json", out)
    log.write(token="abc", answer="authenticated", ms=0.5)
    log.flush()
    doc = json.loads(out.getvalue())
    assert doc["msg"] == "review"
    assert doc["answer"] == "authenticated"
    assert doc["ms"] == 0.5


async def test_lines_are_batched_and_flushed_by_the_loop() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    for i in range(3):
        log.write(n=i)
    assert out.getvalue() == ""
    await asyncio.sleep(0.15)
    assert out.getvalue().count("\n") == 3


def test_a_closed_stream_does_not_raise() -> None:
    out = io.StringIO()
    out.close()
    log = ReviewLog("text", out)
    log.write(n=1)
    log.flush()
