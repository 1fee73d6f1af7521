"""``authn-gateway admin ...``: talk to a running gateway's admin API.

    authn-gateway admin evict --user alice
    authn-gateway admin evict --token-id 3f2a9c01b7de
    authn-gateway admin deny --user alice --seconds 3600
    authn-gateway admin deny --credential-id JTI=7f3c2a --seconds 3600
    authn-gateway admin denied
    authn-gateway admin lift --user alice
    authn-gateway admin breakers
    authn-gateway admin force-open keystone --seconds 1800
    authn-gateway admin force-closed keystone
    authn-gateway admin release keystone

The admin token is read from ``--token-file`` or ``$AUTHN_GATEWAY_ADMIN_TOKEN``,
never from the command line (other users see arguments in ps). The gateway's
JSON answer is printed; the exit code is 0 when it did what was asked.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from authn_gateway import cli_args
from backends.base import BackendConfigError
from backends.durations import AGE_MAX, TIMEOUT_MAX, YEAR
from backends.files import SECRET_BYTES, FileRefused, read_text, shown
from backends.http import ca_context

TOKEN_ENV = "AUTHN_GATEWAY_ADMIN_TOKEN"
URL_ENV = "AUTHN_GATEWAY_ADMIN_URL"
# The admin API is served on the ops listener (server.ops), port 9090 in deploy/ and the
# reference config: what `kubectl port-forward deploy/authn-gateway 9090` reaches. A
# gateway without server.ops serves it on its review port: give --url then.
DEFAULT_URL = "http://127.0.0.1:9090"


def add_parser(sub: Any) -> None:
    admin = sub.add_parser(
        "admin",
        help="evict or deny identities, or override breakers, on a running gateway",
        description="Send one admin request to a running gateway (the ops listener when "
        "server.ops is set) and print its JSON answer. The admin token comes from "
        f"--token-file or ${TOKEN_ENV}.",
    )
    admin.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the gateway's ops listener (server.ops), or its review port when it has none "
        f"(default: ${URL_ENV} or {DEFAULT_URL}, the ops port deploy/ uses)",
    )
    admin.add_argument("--token-file", type=Path, metavar="FILE", help="file holding admin.token")
    admin.add_argument("--ca-file", type=Path, metavar="FILE", help="CA bundle for an https URL")
    # Each number bounded (cli_args): a request timeout httpx and the socket take, a
    # denial no longer than the longest deny_list.max_seconds, an override no longer than
    # the longest admin.override_max_seconds; the gateway refuses past its own.
    admin.add_argument(
        "--timeout", type=cli_args.seconds(TIMEOUT_MAX), default=10.0, metavar="SECONDS"
    )
    admin.add_argument(
        "--as",
        dest="operator",
        default=os.environ.get("USER") or None,
        metavar="NAME",
        help="your name, for the gateway's audit log (default: $USER)",
    )
    actions = admin.add_subparsers(dest="action", required=True, metavar="ACTION")

    evict = actions.add_parser(
        "evict", help="drop a user's, a token's or a credential's cached answers on every replica"
    )
    _subject_args(evict)
    deny = actions.add_parser(
        "deny", help="refuse a user, a token or a credential for SECONDS, fleet-wide"
    )
    _subject_args(deny)
    deny.add_argument(
        "--seconds",
        type=cli_args.whole(1, int(YEAR), "seconds"),
        required=True,
        help="how long to refuse (at most the gateway's deny_list.max_seconds)",
    )
    actions.add_parser("denied", help="list the deny list's entries")
    lift = actions.add_parser("lift", help="lift a denial")
    _subject_args(lift)
    actions.add_parser("breakers", help="every replica's breakers and the overrides in force")
    for action, text in (
        (
            "force-open",
            "never call BACKEND's IdP (fleet-wide with Redis) until released or expired",
        ),
        ("force-closed", "always call BACKEND's IdP, breaker disabled, until released or expired"),
        ("release", "end BACKEND's override: its breaker's own state applies again"),
    ):
        override = actions.add_parser(action, help=text)
        override.add_argument("backend", metavar="BACKEND")
        if action != "release":
            override.add_argument(
                "--seconds",
                type=cli_args.whole(1, int(AGE_MAX), "seconds"),
                help="how long the override lasts (default: admin.override_default_seconds, "
                "1 h); repeating the command renews it",
            )


def _subject_args(parser: argparse.ArgumentParser) -> None:
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", metavar="NAME", help="a username, as the review log shows it")
    who.add_argument(
        "--token-id", metavar="ID", help="a token's id (12 hex digits) from the review log"
    )
    who.add_argument(
        "--credential-id",
        metavar="ID",
        help="kube's credential id (JTI=..., as kube-apiserver's audit log and "
        "user.extra show it): every token carrying it",
    )


class Refused(Exception):
    """A command line this command cannot send: one line, naming the option, never a
    token."""


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            # A pipe too: --token-file <(kubectl get secret ...) is a way to pass it.
            token = read_text(args.token_file, SECRET_BYTES, pipes=True).strip()
        except FileRefused as exc:
            raise Refused(f"--token-file: {exc}") from None
        where = f"--token-file {shown(args.token_file)}"
    else:
        token, where = os.environ.get(TOKEN_ENV, "").strip(), TOKEN_ENV
    # A header value: admin.token is generated (base64), and anything else would be
    # refused by the HTTP client with an error that quotes the token.
    if token and not all("!" <= c <= "~" for c in token):
        raise Refused(f"the admin token ({where}) is not printable ASCII without spaces")
    return token or None


#: The arguments that go into the request, by their destination: how the command line
#: spells each.
_NAMES = {
    "backend": "BACKEND",
    "user": "--user",
    "token_id": "--token-id",
    "credential_id": "--credential-id",
    "operator": "--as",
}


def _checked(args: argparse.Namespace) -> tuple[str, ssl.SSLContext | bool]:
    """The gateway's URL and what verifies its certificate, or :class:`Refused`."""
    for name, flag in _NAMES.items():
        value = getattr(args, name, None)
        if isinstance(value, str) and not _utf8(value):
            raise Refused(f"{flag}: not UTF-8 text")
    try:
        url = httpx.URL(args.url)
    except httpx.InvalidURL:
        raise Refused(f"--url: {shown(args.url)} is not a URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise Refused(f"--url: {shown(args.url)} is not an http:// or https:// URL")
    if args.ca_file is None:
        return args.url, True
    try:
        return args.url, ca_context(args.ca_file, "--ca-file")
    except BackendConfigError as exc:
        raise Refused(str(exc)) from None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument's byte that is not UTF-8 (surrogateescape)
        return False
    return True


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    if args.action == "breakers":
        return "GET", "/admin/breakers", None
    if args.action in ("force-open", "force-closed", "release"):
        body: dict[str, Any] = {"by": args.operator} if args.operator else {}
        if getattr(args, "seconds", None) is not None:
            body["seconds"] = args.seconds
        return "POST", f"/admin/breakers/{quote(args.backend, safe='')}/{args.action}", body
    subject: dict[str, Any] = {}
    if args.action != "denied":
        subject = (
            {"user": args.user}
            if args.user is not None
            else {"token_id": args.token_id}
            if args.token_id is not None
            else {"credential_id": args.credential_id}
        )
        if args.operator:
            subject["by"] = args.operator
    if args.action == "evict":
        return "POST", "/admin/evict", subject
    if args.action == "deny":
        return "POST", "/admin/deny", {**subject, "seconds": args.seconds}
    if args.action == "lift":
        return "DELETE", "/admin/deny", subject
    return "GET", "/admin/deny", None


def cmd_admin(args: argparse.Namespace) -> int:
    try:
        token = _admin_token(args)
        base, verify = _checked(args)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    if token is None:
        print(f"no admin token: use --token-file FILE or set {TOKEN_ENV}", file=sys.stderr)
        return 2
    method, path, body = _request(args)
    url = base.rstrip("/") + path
    try:
        with httpx.Client(timeout=args.timeout, verify=verify) as client:
            response = client.request(
                method,
                url,
                headers={"authorization": f"Bearer {token}"},
                content=orjson.dumps(body) if body is not None else None,
            )
    except httpx.HTTPError as exc:
        print(
            f"cannot reach the gateway at {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 1
    try:
        answer = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        print(f"{method} {path}: HTTP {response.status_code}, not a JSON answer", file=sys.stderr)
        return 1
    sys.stdout.write(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode() + "\n")
    if response.status_code >= 400:
        message = answer.get("message") if isinstance(answer, dict) else None
        if response.status_code == 429 and "retry-after" in response.headers:
            message = f"{message} (retry after {response.headers['retry-after']} s)"
        print(f"{method} {path}: HTTP {response.status_code}: {message}", file=sys.stderr)
        return 1
    return 0
