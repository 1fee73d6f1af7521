"""Review log lines: logfmt or JSON, batched, never failing a review."""

from __future__ import annotations

import asyncio
import io
import json

from authn_gateway.reviewlog import ReviewLog


def test_text_lines_are_logfmt_with_quoting() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    log.write(
        token="abc123",
        answer="rejected",
        backend="s",
        ms=0.5,
        cached=False,
        reason='unknown "static" token',
        caller="10.0.0.1",
    )
    log.write(
        token="abc123",
        answer="authenticated",
        backend="s",
        ms=0.1,
        cached=True,
        stale=True,
        user="Jane Doe",
    )
    log.flush()
    assert out.getvalue().splitlines() == [
        "review token=abc123 answer=rejected backend=s ms=0.5 cached=False "
        'reason="unknown \\"static\\" token" caller=10.0.0.1',
        "review token=abc123 answer=authenticated backend=s ms=0.1 cached=True stale=True "
        'user="Jane Doe"',
    ]


def test_json_lines_parse() -> None:
    out = io.StringIO()
    log = ReviewLog("json", out)
    log.write(token="abc", answer="authenticated", backend="s", ms=0.5, cached=True)
    log.flush()
    doc = json.loads(out.getvalue())
    assert doc["msg"] == "review"
    assert doc["answer"] == "authenticated"
    assert doc["ms"] == 0.5


async def test_lines_are_batched_and_flushed_by_the_loop() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    for i in range(3):
        log.write(token=str(i), answer="rejected", backend="s", ms=1.0, cached=False)
    assert out.getvalue() == ""
    await asyncio.sleep(0.15)
    assert out.getvalue().count("\n") == 3


def test_a_closed_stream_does_not_raise() -> None:
    out = io.StringIO()
    out.close()
    log = ReviewLog("text", out)
    log.write(token="t", answer="rejected", backend="s", ms=1.0, cached=False)
    log.flush()
