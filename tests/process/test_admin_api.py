"""The admin API's request validation, on a real server over real sockets (issue 29,
findings 11 and 13).

Every body gets a 400 or 413 whose message names what is wrong, or the action it asks
for, exactly; never a 500. Bodies are capped while they are read: a declared length
over 4 KiB is refused before the body is sent, a chunked one as soon as it passes it.
The properties are fuzzed with hypothesis (``HYPOTHESIS_PROFILE=long`` for more).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from authn_gateway.serve.admin_api import MAX_BODY
from tests.support.procs import GatewayProcess, free_port, start_gateway

TOKEN = base64.b64encode(os.urandom(32)).decode()

AUTH = {"authorization": f"Bearer {TOKEN}"}

MAX_DENY_SECONDS = 3600

MAX_OVERRIDE_SECONDS = 600

# A backend with a breaker (static has none); nothing listens on its port.
BACKEND = {
    "name": "idp",
    "type": "userinfo",
    "url": "http://127.0.0.1:9/userinfo",
    "timeouts": {"connect_seconds": 0.2, "read_seconds": 0.2, "total_seconds": 0.5},
}


class Admin:
    def __init__(self, gw: GatewayProcess, port: int) -> None:
        self.gw = gw
        self.port = port
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10)


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admin]:
    ops_port = free_port()
    gw = start_gateway(
        {
            "server": {"ops": {"port": ops_port}},
            "admin": {
                "enabled": True,
                "token": TOKEN,
                "override_default_seconds": 60,
                "override_max_seconds": MAX_OVERRIDE_SECONDS,
            },
            "deny_list": {"max_seconds": MAX_DENY_SECONDS},
            "backends": [BACKEND],
        },
        Path(tmp_path_factory.mktemp("admin-api")),
    )
    deadline = time.monotonic() + 30
    while "Application startup complete" not in gw.logs():
        assert gw.proc.poll() is None and time.monotonic() < deadline, gw.logs()
        time.sleep(0.05)
    api = Admin(gw, ops_port)
    yield api
    api.client.close()
    gw.stop()
    logs = gw.logs()
    assert "Traceback" not in logs and "internal error" not in logs.lower(), logs


def exchange(port: int, head: bytes, body: bytes, wait: float = 5.0) -> tuple[int, bytes, float]:
    """Send ``head`` and ``body`` and do not end the body; the answer's status, what was
    read, and how long it took from the last byte sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(head + body)
        sent = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer after {answer!r}"
            answer += chunk
        return int(answer.split(b" ", 2)[1]), answer, time.monotonic() - sent


def head(path: str, framing: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("path", ["/admin/deny", "/admin/evict", "/admin/breakers/idp/force-open"])
def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_sent(
    admin: Admin, path: str
) -> None:
    # 150 MiB announced, 10 bytes sent: the answer comes at once, without the body.
    status, answer, took = exchange(admin.port, head(path, "Content-Length: 157286400"), b"{" * 10)
    assert status == 413, answer
    assert f"body larger than {MAX_BODY} bytes".encode() in answer, answer
    assert took < 2.0, took


@pytest.mark.parametrize("path", ["/admin/deny", "/admin/evict", "/admin/breakers/idp/force-open"])
def test_a_chunked_body_is_cut_off_at_the_cap_not_read_to_its_end(admin: Admin, path: str) -> None:
    # 8 KiB of chunks and no last chunk: before, the server waited for the end of a body
    # of any size; now it answers once 4 KiB have passed.
    chunk = b" " * 1024
    body = b"1\r\n{\r\n" + (b"400\r\n" + chunk + b"\r\n") * 8
    status, answer, took = exchange(admin.port, head(path, "Transfer-Encoding: chunked"), body)
    assert status == 413, answer
    assert took < 2.0, took


def test_a_body_at_the_cap_is_read(admin: Admin) -> None:
    doc = {"user": "capped", "seconds": 60, "by": "x"}
    text = json.dumps(doc)
    padded = text[:-1] + " " * (MAX_BODY - len(text)) + "}"
    assert len(padded) == MAX_BODY
    answer = admin.client.post("/admin/deny", content=padded)
    assert answer.status_code == 200, answer.text
    assert admin.client.post("/admin/deny", content=padded[:-1] + " }").status_code == 413


def test_a_big_body_sent_in_full_is_refused_and_the_server_stays_small(admin: Admin) -> None:
    rss_before = rss_kib(admin.gw.proc.pid)
    with socket.create_connection(("127.0.0.1", admin.port), timeout=10) as sock:
        sock.sendall(head("/admin/deny", f"Content-Length: {64 * 1024 * 1024}"))
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        # Keep sending what was announced: the server reads and drops it, or closes.
        sent = 0
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(b" " * 1024 * 1024)
                sent += 1024 * 1024
        except OSError:
            pass
    grew = rss_kib(admin.gw.proc.pid) - rss_before
    assert grew < 16 * 1024, f"RSS grew {grew} KiB after {sent} bytes of refused body"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("route", ["evict", "deny", "lift"])
def test_a_token_id_with_a_trailing_newline_is_refused_on_every_route(
    admin: Admin, route: str
) -> None:
    doc: dict[str, Any] = {"token_id": "01cab284ec36\n", "seconds": 60}
    method, path = {
        "evict": ("POST", "evict"),
        "deny": ("POST", "deny"),
        "lift": ("DELETE", "deny"),
    }[route]
    answer = admin.client.request(method, f"/admin/{path}", json=doc)
    assert answer.status_code == 400, answer.text
    assert answer.json()["message"].startswith("token_id: "), answer.text
    listed = admin.client.get("/admin/deny").json()["entries"]
    assert all(e.get("token_id") != "01cab284ec36\n" for e in listed), listed


SUBJECT_KEYS = ("user", "token_id")


def subject_problems(doc: dict[str, Any]) -> tuple[list[str], dict[str, str] | None]:
    """The fields a subject body gets wrong (or "body" for the shape), else its subject."""
    given = [k for k in SUBJECT_KEYS if k in doc]
    if len(given) != 1:
        return ["body"], None
    key = given[0]
    value = doc[key]
    if not isinstance(value, str):
        return [key], None
    if key == "user":
        ok = 0 < len(value) <= 256 and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    else:
        ok = len(value) == 12 and all(c in "0123456789abcdef" for c in value)
    return ([], {key: value}) if ok else ([key], None)


def by_problems(doc: dict[str, Any]) -> list[str]:
    by = doc.get("by")
    if by is None:
        return []
    good = (
        isinstance(by, str)
        and 0 < len(by) <= 64
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in by)
    )
    return [] if good else ["by"]


def seconds_ok(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit


def expect_problem(answer: httpx.Response, problems: list[str], doc: Any) -> None:
    assert answer.status_code == 400, (doc, problems, answer.status_code, answer.text)
    message = answer.json()["message"]
    assert isinstance(message, str), message
    named = [p for p in problems if message.startswith(f"{p}: ") or message.startswith(f"{p} ")]
    named += [p for p in problems if p == "unknown" and message.startswith("unknown field ")]
    assert named, f"{doc!r}: expected one of {problems}, got {message!r}"


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)

json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)

token_ids = st.sampled_from(
    ["01cab284ec36", "01cab284ec36\n", "01CAB284EC36", "0" * 11, "x" * 12]
) | (st.text("0123456789abcdef", min_size=11, max_size=13))

users = st.sampled_from(["alice", "", "a\nb", "a\x7f", "x" * 256, "x" * 257, "é"]) | st.text(
    max_size=30
)

seconds = st.sampled_from(
    [0, 1, 60, MAX_DENY_SECONDS, MAX_DENY_SECONDS + 1, -1, True, 1.5, "60", 2**64]
)

names = st.sampled_from([None, "oncall", "", "a\tb", "x" * 64, "x" * 65, 7]) | st.text(max_size=70)

admin_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "user": users | json_values,
            "token_id": token_ids | json_values,
            "seconds": seconds | json_values,
            "by": names | json_values,
            "extra": json_values,
        },
    )
    | json_values
)

# Bodies shaped like real requests, so that valid actions are common and the near
# misses sit next to them.
printable = st.characters(min_codepoint=0x20, blacklist_characters="\x7f")

good_users = st.sampled_from(["alice", "bob@example.org"]) | st.text(
    printable, min_size=1, max_size=40
)

good_token_ids = st.text("0123456789abcdef", min_size=12, max_size=12)

good_names = st.text(printable, min_size=1, max_size=64)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, bad)


subjects = st.fixed_dictionaries({"user": mostly(good_users, users)}) | st.fixed_dictionaries(
    {"token_id": mostly(good_token_ids, token_ids)}
)

shaped_bodies = st.builds(
    lambda subject, rest: {**subject, **rest},
    subjects,
    st.fixed_dictionaries(
        {"seconds": mostly(st.integers(1, MAX_DENY_SECONDS), seconds)},
        optional={"by": mostly(good_names, names), "note": json_values},
    ),
)

identity_bodies = mostly(shaped_bodies, admin_bodies)

override_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "seconds": st.integers(1, MAX_OVERRIDE_SECONDS) | seconds,
            "by": good_names | names,
        },
    )
    | admin_bodies
)

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def send(admin: Admin, method: str, path: str, doc: Any) -> httpx.Response:
    # json.dumps: orjson refuses integers past 64 bits, which a client may send.
    answer = admin.client.request(method, path, content=json.dumps(doc).encode())
    event(f"{method} {path.rsplit('/', 1)[-1]} -> {answer.status_code}")
    return answer


@FUZZ
@given(doc=identity_bodies, route=st.sampled_from(["evict", "deny", "lift"]))
def test_identity_routes_answer_any_json_with_a_named_400_or_the_exact_action(
    admin: Admin, doc: Any, route: str
) -> None:
    method = "DELETE" if route == "lift" else "POST"
    path = "/admin/evict" if route == "evict" else "/admin/deny"
    answer = send(admin, method, path, doc)
    if not isinstance(doc, dict):
        expect_problem(answer, ["body"], doc)
        return
    problems = by_problems(doc)
    subject_wrong, subject = subject_problems(doc)
    problems += subject_wrong
    if route == "deny" and not seconds_ok(doc.get("seconds"), MAX_DENY_SECONDS):
        problems.append("seconds")
    if problems:
        expect_problem(answer, problems, doc)
        return
    assert answer.status_code == 200, (doc, answer.status_code, answer.text)
    body = answer.json()
    done = {"evict": "evicted", "deny": "denied", "lift": "lifted"}[route]
    assert body[done] == subject, (doc, body)
    if route == "deny":
        assert body["seconds"] == doc["seconds"], (doc, body)
        listed = admin.client.get("/admin/deny").json()["entries"]
        assert any({k: e.get(k) for k in subject} == subject for e in listed), (subject, listed)


@FUZZ
@given(
    doc=st.none() | override_bodies,
    action=st.sampled_from(["force-open", "force-closed", "release"]),
)
def test_breaker_routes_answer_any_json_with_a_named_400_or_the_exact_action(
    admin: Admin, doc: Any, action: str
) -> None:
    path = f"/admin/breakers/idp/{action}"
    if doc is None:  # no body at all: the default duration
        answer = admin.client.post(path)
        assert answer.status_code == 200, answer.text
        assert answer.json()["action"] == action
        return
    answer = send(admin, "POST", path, doc)
    if not isinstance(doc, dict):
        expect_problem(answer, ["body"], doc)
        return
    problems = by_problems(doc)
    if set(doc) - {"seconds", "by"}:
        problems.append("unknown")
    if "seconds" in doc and (
        action == "release" or not seconds_ok(doc["seconds"], MAX_OVERRIDE_SECONDS)
    ):
        problems.append("seconds")
    if problems:
        expect_problem(answer, problems, doc)
        return
    assert answer.status_code == 200, (doc, answer.status_code, answer.text)
    body = answer.json()
    assert body["action"] == action and body["backend"] == "idp", body
    expected_state = {"force-open": "forced_open", "force-closed": "forced_closed"}.get(action)
    if expected_state is not None:
        assert body["state"] == expected_state, body
        assert body["override"]["expires_in_seconds"] <= doc.get("seconds", 60), body
    else:
        assert body["override"] is None, body


@FUZZ
@given(raw=st.binary(max_size=200), path=st.sampled_from(["/admin/evict", "/admin/deny"]))
def test_bytes_that_are_not_json_get_a_400_never_a_500(admin: Admin, raw: bytes, path: str) -> None:
    answer = admin.client.post(path, content=raw)
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = ...
    if doc is ...:
        assert answer.status_code == 400, (raw, answer.text)
        assert answer.json()["message"] == "body is not valid JSON", answer.text
    else:
        assert answer.status_code in (200, 400), (raw, answer.status_code, answer.text)
