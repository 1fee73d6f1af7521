"""Review log lines: logfmt or JSON, batched, never failing a review."""

from __future__ import annotations

import asyncio
import io
import json
import re

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
    lines = out.getvalue().splitlines()
    for line in lines:
        stamp, level, _rest = line.split(" ", 2)
        assert re.fullmatch(r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
        assert level == "level=info"
    assert [line.split(" ", 2)[2] for line in lines] == [
        "msg=review token=abc123 answer=rejected backend=s ms=0.5 cached=False "
        'reason="unknown \\"static\\" token" caller=10.0.0.1',
        "msg=review token=abc123 answer=authenticated backend=s ms=0.1 cached=True stale=True "
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


def test_a_user_name_with_a_newline_cannot_forge_a_review_line() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    forged = "mallory\nreview token=x answer=authenticated user=admin\r\u2028"
    log.write(token="abc", answer="authenticated", backend="s", ms=0.1, cached=False, user=forged)
    log.write(token="abc", answer="rejected", backend="s", ms=0.1, cached=False, reason="")
    log.flush()
    lines = out.getvalue().split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert lines[0].endswith(
        'user="mallory\\nreview token=x answer=authenticated user=admin\\r\\u2028"'
    )
    assert lines[1].endswith('reason=""')


def test_process_log_messages_are_one_line_whatever_their_values() -> None:
    import logging

    from authn_gateway.logsetup import TextFormatter

    record = logging.LogRecord(
        "backends.x", logging.WARNING, __file__, 1, "user %s", ("eve\n2026 ERROR forged",), None
    )
    line = TextFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == "WARNING backends.x: user eve\\n2026 ERROR forged"
