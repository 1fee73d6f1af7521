"""A gateway whose log reader stops reading keeps answering: reviews and health are
never held up by logging, and the lines it could not write are counted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import free_port, metric_value, review_body, wait_for_port


class Drain:
    """Reads a pipe into memory from the moment it is started."""

    def __init__(self, pipe: object) -> None:
        self.pipe = pipe
        self.data = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while chunk := self.pipe.read1(1 << 16):  # type: ignore[attr-defined]
            self.data += chunk

    def text(self) -> str:
        return self.data.decode(errors="replace")


def test_a_log_pipe_nobody_reads_blocks_neither_reviews_nor_health(
    tmp_path: Path, fake_idp: FakeIdP
) -> None:
    port, ops_port = free_port(), free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port, "ops": {"port": ops_port}, "audit_log": "-"},
        # The deploy config's logs: JSON review lines on stderr, audit lines on stdout.
        "logging": {"format": "json", "queue_lines": 100, "audit_queue_lines": 100},
        "backends": [userinfo_backend(fake_idp)],
    }
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    # Both pipes are left unread, like a stuck log agent: 64 KiB each, then full.
    proc = subprocess.Popen(
        [sys.executable, "-m", "authn_gateway", "serve", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, proc=proc)
        wait_for_port(ops_port, proc=proc)
        url, ops = f"http://127.0.0.1:{port}/authenticate", f"http://127.0.0.1:{ops_port}"
        reviews = 2000  # ~400 KB of review and audit lines, six times what the pipes hold
        with httpx.Client(timeout=10) as client:
            for i in range(reviews):
                token = f"good-user{i % 50}" if i % 4 else f"bad-{i}"
                status = client.post(url, json=review_body(token)).json()["status"]
                assert status["authenticated"] is bool(i % 4), (i, status)
                if i % 200 == 0:
                    assert client.get(f"{ops}/healthz").text == "ok", i
            assert client.get(f"{ops}/healthz").status_code == 200
            assert client.get(f"{ops}/readyz").status_code == 200
            scrape = client.get(f"{ops}/metrics").text
        dropped_reviews = metric_value(
            scrape, "authn_gateway_log_lines_dropped_total", log="review"
        )
        dropped_audit = metric_value(scrape, "authn_gateway_log_lines_dropped_total", log="audit")
        # Lines that fitted: what each pipe holds, one batch in the writer, the queue.
        assert dropped_reviews >= reviews - (64 * 1024 // 150 + 2 * 100)
        assert dropped_audit >= reviews - (64 * 1024 // 150 + 2 * 100)
        assert metric_value(scrape, "authn_gateway_log_queue_lines", destination="stderr") <= 100

        # The reader comes back: what was queued is written, and an outage's repeated
        # reasons come as one summary line per second, with a count.
        out, err = Drain(proc.stdout), Drain(proc.stderr)
        out.thread.start()
        err.thread.start()
        fake_idp.configure(status=503)
        with httpx.Client(timeout=10) as client:
            for i in range(60):
                status = client.post(url, json=review_body(f"good-cold{i}")).json()["status"]
                assert status["authenticated"] is False and "error" in status
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and '"review_summary"' not in err.text():
            time.sleep(0.1)
        summaries = [line for line in err.text().splitlines() if '"review_summary"' in line]
        assert summaries, err.text()[-2000:]
        unavailable_lines = [
            line
            for line in err.text().splitlines()
            if '"answer":"unavailable"' in line and '"msg":"review"' in line
        ]
        # Far fewer lines than reviews: the first per reason and window, then counts.
        assert len(unavailable_lines) < 20, unavailable_lines
        assert '"audit"' in out.text()
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0
