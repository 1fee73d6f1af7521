"""Review log lines: logfmt or JSON, queued for a writer thread, never failing or
holding up a review; outage reasons summarised."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from pathlib import Path

import pytest

from authn_gateway.observe import reviewlog
from authn_gateway.observe.audit import AuditLog
from authn_gateway.observe.logsink import LogSink
from authn_gateway.observe.reviewlog import ReviewLog
from backends.base import Rejected


def written(log: ReviewLog, out: io.StringIO) -> list[str]:
    log.flush()
    assert log.sink.flush(5.0)
    return out.getvalue().splitlines()


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
    lines = written(log, out)
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


def test_quoted_values_are_remembered_within_a_bound_and_stay_quoted() -> None:
    reviewlog._QUOTED.clear()
    for i in range(reviewlog._QUOTED_MAX + 10):
        assert reviewlog._logfmt(f"user {i}") == f'"user {i}"'
        assert len(reviewlog._QUOTED) <= reviewlog._QUOTED_MAX
    # Remembered or not, a value that could end the line is escaped every time.
    for _ in range(2):
        assert reviewlog._logfmt("eve\nmsg=review") == '"eve\\nmsg=review"'
        assert reviewlog._logfmt("") == '""'
        assert reviewlog._logfmt("plain") == "plain"


def test_the_time_stamp_moves_with_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_700_000_000.0004]
    monkeypatch.setattr(reviewlog.time, "time", lambda: now[0])
    assert reviewlog._utc_now() == "2023-11-14T22:13:20.000Z"
    now[0] += 0.0003  # the same millisecond: the same text
    assert reviewlog._utc_now() == "2023-11-14T22:13:20.000Z"
    now[0] += 0.0011
    assert reviewlog._utc_now() == "2023-11-14T22:13:20.001Z"
    now[0] += 1.0
    assert reviewlog._utc_now() == "2023-11-14T22:13:21.001Z"


def test_json_lines_parse() -> None:
    out = io.StringIO()
    log = ReviewLog("json", out)
    log.write(token="abc", answer="authenticated", backend="s", ms=0.5, cached=True)
    doc = json.loads(written(log, out)[0])
    assert doc["msg"] == "review"
    assert doc["answer"] == "authenticated"
    assert doc["ms"] == 0.5


def test_a_line_names_the_cluster_when_one_is_given() -> None:
    for form in ("text", "json"):
        out = io.StringIO()
        log = ReviewLog(form, out)
        log.write(token="abc", answer="authenticated", backend="s", ms=0.5, cached=True)
        log.write(
            token="abc", answer="rejected", backend="s", ms=0.5, cached=True, cluster="prod-eu"
        )
        without, named = written(log, out)
        assert "cluster" not in without  # no clusters configured: the line as before
        if form == "text":
            assert named.endswith(" cluster=prod-eu")
        else:
            assert json.loads(named)["cluster"] == "prod-eu"


async def test_the_audit_log_names_the_cluster_when_one_is_given(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    for cluster in (None, "prod-eu"):
        audit.write(
            caller="token:prod",
            backend="s",
            answer="rejected",
            outcome=Rejected("no"),
            token_id="0123456789ab",
            stale=False,
            cluster=cluster,
        )
    assert audit.sink.flush(5.0)
    audit.sink.close()
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert "cluster" not in first and second["cluster"] == "prod-eu"


async def test_lines_are_written_by_the_sink_thread_without_a_flush() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    for i in range(3):
        log.write(token=str(i), answer="rejected", backend="s", ms=1.0, cached=False)
    for _ in range(100):
        if out.getvalue().count("\n") == 3:
            break
        await asyncio.sleep(0.05)
    assert out.getvalue().count("\n") == 3


def unavailable(log: ReviewLog, backend: str, reason: str, token: str = "t") -> None:
    log.write(
        token=token, answer="unavailable", backend=backend, ms=1.0, cached=False, reason=reason
    )


async def test_repeated_outage_reasons_become_one_summary_line_per_window() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out, summary_seconds=60)
    for i in range(5):
        unavailable(log, "idp", "circuit breaker open", token=f"t{i}")
    unavailable(log, "idp", "HTTP 503")
    unavailable(log, "ldap", "circuit breaker open")
    # Other answers are never summarised.
    for _ in range(2):
        log.write(token="r", answer="rejected", backend="idp", ms=1.0, cached=False, reason="x")
    # Past the time and level fields, which every line has.
    lines = [line.split(" ", 2)[2] for line in written(log, out)]
    assert lines[:5] == [
        "msg=review token=t0 answer=unavailable backend=idp ms=1.0 cached=False "
        'reason="circuit breaker open"',
        'msg=review token=t answer=unavailable backend=idp ms=1.0 cached=False reason="HTTP 503"',
        "msg=review token=t answer=unavailable backend=ldap ms=1.0 cached=False "
        'reason="circuit breaker open"',
        "msg=review token=r answer=rejected backend=idp ms=1.0 cached=False reason=x",
        "msg=review token=r answer=rejected backend=idp ms=1.0 cached=False reason=x",
    ]
    assert lines[5:] == [
        'msg=review_summary answer=unavailable backend=idp reason="circuit breaker open" '
        "count=4 seconds=60"
    ]
    # A new window logs the first answer in full again.
    unavailable(log, "idp", "circuit breaker open", token="next")
    assert "msg=review token=next answer=unavailable" in written(log, out)[-1]


async def test_the_event_loop_ends_each_summary_window() -> None:
    out = io.StringIO()
    log = ReviewLog("json", out, summary_seconds=0.05)
    for _ in range(3):
        unavailable(log, "idp", "no answer within 1s")
    docs: list[dict[str, object]] = []
    for _ in range(100):
        await asyncio.sleep(0.05)
        docs = [json.loads(line) for line in out.getvalue().splitlines()]
        if len(docs) == 2:
            break
    assert [d["msg"] for d in docs] == ["review", "review_summary"]
    assert docs[1]["count"] == 2 and docs[1]["backend"] == "idp"


def test_summaries_off_logs_every_line() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out, summary_seconds=0)
    for _ in range(3):
        unavailable(log, "idp", "HTTP 503")
    assert len(written(log, out)) == 3


def test_a_closed_stream_does_not_raise() -> None:
    out = io.StringIO()
    out.close()
    log = ReviewLog("text", out)
    log.write(token="t", answer="rejected", backend="s", ms=1.0, cached=False)
    log.flush()
    assert log.sink.flush(5.0)


def test_a_pipe_nobody_reads_costs_counted_drops_not_a_wait() -> None:
    read_end, write_end = os.pipe()
    try:
        # A real pipe, opened as a file destination: the writer thread blocks in write().
        sink = LogSink(f"/proc/self/fd/{write_end}", capacity=100)
        line = "x" * 200
        for _ in range(5000):  # ~1 MB: far more than the pipe's 64 KiB
            sink.put(line, "review")
        assert sink.queued() <= 100
        # Accepted: the queue, one batch in the writer's hands, and what the pipe holds.
        assert sink.dropped["review"] >= 5000 - 2 * 100 - 64 * 1024 // 201
        # The writer was stuck, not dead: once read, the queue drains.
        drained = b""
        os.set_blocking(read_end, False)
        for _ in range(200):
            done = sink.flush(0.05)
            try:
                while chunk := os.read(read_end, 1 << 20):
                    drained += chunk
            except BlockingIOError:
                pass
            if done:
                break
        assert sink.queued() == 0
        assert drained.count(b"\n") == 5000 - sink.dropped["review"]
        sink.close()
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_file_destination_appends(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text("earlier\n")
    sink = LogSink(str(path))
    sink.put("later", "audit")
    assert sink.flush(5.0)
    sink.close()
    assert path.read_text() == "earlier\nlater\n"


def test_a_user_name_with_a_newline_cannot_forge_a_review_line() -> None:
    out = io.StringIO()
    log = ReviewLog("text", out)
    forged = "mallory\nreview token=x answer=authenticated user=admin\r\u2028"
    log.write(token="abc", answer="authenticated", backend="s", ms=0.1, cached=False, user=forged)
    log.write(token="abc", answer="rejected", backend="s", ms=0.1, cached=False, reason="")
    log.flush()
    assert log.sink.flush(5.0)
    lines = out.getvalue().split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert lines[0].endswith(
        'user="mallory\\nreview token=x answer=authenticated user=admin\\r\\u2028"'
    )
    assert lines[1].endswith('reason=""')


def test_process_log_messages_are_one_line_whatever_their_values() -> None:
    import logging

    from authn_gateway.observe.logsetup import TextFormatter

    record = logging.LogRecord(
        "backends.x", logging.WARNING, __file__, 1, "user %s", ("eve\n2026 ERROR forged",), None
    )
    line = TextFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == "WARNING backends.x: user eve\\n2026 ERROR forged"
