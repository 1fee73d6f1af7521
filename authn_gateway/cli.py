"""Command line: ``authn-gateway serve | check-config | review | admin``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import NoReturn

import orjson
from pydantic import ValidationError

from authn_gateway import __version__, admin_cli, cli_args
from authn_gateway.config import ConfigError, GatewayConfig, ServerSettings, load_config
from authn_gateway.observe.internal_errors import unexpected
from authn_gateway.observe.logsetup import configure_logging
from authn_gateway.review.tokenreview import API_VERSIONS, describe, render_verdict
from backends.context import DEFAULT_CLUSTER
from backends.files import DENY_LIST_BYTES, FileRefused, check_file, shown
from backends.settings import MAX_TOKEN_BYTES


class _Parser(argparse.ArgumentParser):
    """A command-line error is one line and exit status 1, like a config error."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="authn-gateway",
        description="A Kubernetes TokenReview webhook that shields identity providers "
        "with caching, coalescing, circuit breakers and rate limits.",
    )
    parser.add_argument("--version", action="version", version=f"authn-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the webhook server",
        description="Run the webhook. Without --config, runs the embedded "
        "demo config (static demo tokens, HTTP on 127.0.0.1:8080).",
    )
    serve.add_argument("--config", type=Path, metavar="FILE", help="YAML config file")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument(
        "--port", type=cli_args.whole(0, 65535), help="listen port (overrides server.port)"
    )

    check = sub.add_parser(
        "check-config",
        help="validate a config file and exit",
        description="Validate FILE exactly as 'serve' would; exit 0 if it "
        "is valid, 1 with one line per problem if not.",
    )
    check.add_argument("file", type=Path, metavar="FILE")

    review = sub.add_parser(
        "review",
        help="print the TokenReview answer the gateway would give for a token",
        description="Review one token through the full pipeline (backends included) and print "
        "the TokenReview reply, plus the deciding backend and reason on stderr. Prefer passing "
        "the token on stdin: command-line arguments are visible to other users in ps.",
    )
    review.add_argument(
        "token", nargs="?", default="-", help="the token, or - (default) to read it from stdin"
    )
    review.add_argument("--config", type=Path, metavar="FILE", help="YAML config file")
    review.add_argument("--api-version", choices=sorted(API_VERSIONS), default="v1")
    review.add_argument(
        "--audience",
        action="append",
        default=[],
        metavar="AUD",
        help="requested audience (repeatable)",
    )
    review.add_argument(
        "--cluster",
        metavar="NAME",
        help="review as a kube-apiserver of this cluster (clusters[].name; default: the "
        "cluster 'default')",
    )
    admin_cli.add_parser(sub)
    return parser


def _load(path: Path | None) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return None


def _apply_overrides(
    config: GatewayConfig, host: str | None, port: int | None
) -> GatewayConfig | None:
    """``config`` with --host/--port, validated like the file's own values."""
    update = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if not update:
        return config
    try:
        server = ServerSettings.model_validate({**dict(config.server), **update})
    except ValidationError as exc:
        for err in exc.errors(include_input=False, include_url=False):
            field = err["loc"][0] if err["loc"] else "server"
            msg = err["msg"].removeprefix("Value error, ")
            print(f"authn-gateway: --{field}: {msg}", file=sys.stderr)
        return None
    return config.model_copy(update={"server": server})


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    overridden = _apply_overrides(config, args.host, args.port)
    if overridden is None:
        return 1
    config = overridden
    configure_logging(config.logging.level, config.logging.format, config.logging.queue_lines)
    from authn_gateway.serve.server import serve

    return serve(config, args.config)


async def _build_and_close(config: GatewayConfig, source: str) -> None:
    """Build what serve builds before it listens (the TLS context from its files, the
    gateway with its backends, token files, CA bundles and Redis client), then
    release it. Nothing connects anywhere."""
    from authn_gateway.edge.tls import ServerTLS, TLSError
    from authn_gateway.serve.gateway import Gateway

    s = config.server
    if s.tls is not None:
        try:
            ServerTLS(s.tls, client_cert_optional=bool(s.caller_tokens))
        except TLSError as exc:
            raise ConfigError(source, [f"server.{exc}"]) from None
    if s.audit_log not in (None, "-"):
        # Appended to, never read: a FIFO or device may be one (a log agent's pipe).
        _writable("server.audit_log", Path(s.audit_log), source)
        if Path(s.audit_log).is_dir():
            raise ConfigError(
                source, [f"server.audit_log: {shown(s.audit_log)}: a directory, not a file"]
            )
    if config.deny_list.file is not None and config.redis is None:
        # Written and read back whole: a regular file, if there yet.
        _writable("deny_list.file", config.deny_list.file, source)
        if os.path.lexists(config.deny_list.file):
            try:
                check_file(config.deny_list.file, DENY_LIST_BYTES)
            except FileRefused as exc:
                raise ConfigError(source, [f"deny_list.file: {exc}"]) from None
    gateway = Gateway(config, source=source)
    await gateway.close()
    policy = gateway.authorization.source if gateway.authorization is not None else None
    if policy is not None and policy.error is not None:
        # serve starts without it (answering authorization.on_error); say so here.
        raise ConfigError(source, [f"authorization.keystone_policy_file: {policy.error}"])


def _writable(field: str, path: Path, source: str) -> None:
    """serve creates or writes ``path``: say now if it could not."""
    parent = path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(source, [f"{field}: cannot write in {shown(parent)}"])


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 1
    try:
        asyncio.run(_build_and_close(config, str(args.file)))
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # no config file ends in a traceback
        print(
            f"invalid configuration:\n{args.file}: cannot be checked: {unexpected(exc)}",
            file=sys.stderr,
        )
        return 1
    names = ", ".join(f"{b.name} ({b.type})" for b in config.backends)
    print(f"{args.file}: ok; backends: {names}")
    return 0


async def _review(
    config: GatewayConfig,
    source: Path | str,
    token: str,
    api_version: str,
    audiences: tuple[str, ...],
    cluster: str,
) -> tuple[bytes, str]:
    from authn_gateway.serve.gateway import Gateway

    gateway = Gateway(config, source=str(source))
    await gateway.start()
    try:
        verdict = await gateway.pipeline.review(token, audiences, caller="cli", cluster=cluster)
    finally:
        await gateway.close()
    note = f"cluster {cluster}: {describe(verdict)}"
    return render_verdict(api_version, verdict, gateway.markers).body, note


def cmd_review(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    configure_logging("warning", config.logging.format)
    if args.token == "-":
        # No more than a token can be: a stream without a line break must not fill memory.
        try:
            line = sys.stdin.readline(MAX_TOKEN_BYTES + 1)
        except UnicodeDecodeError:
            print("the token on stdin is not UTF-8 text", file=sys.stderr)
            return 2
        if len(line.rstrip("\r\n")) > MAX_TOKEN_BYTES:
            print(
                f"the token on stdin is longer than {MAX_TOKEN_BYTES} characters", file=sys.stderr
            )
            return 2
        token = line.strip()
    else:
        token = args.token
    if not token:
        print("no token given (argument or stdin)", file=sys.stderr)
        return 2
    clusters = [DEFAULT_CLUSTER, *(c.name for c in config.clusters if c.name != DEFAULT_CLUSTER)]
    cluster = args.cluster or DEFAULT_CLUSTER
    if cluster not in clusters:
        print(
            f"--cluster: no cluster is named {cluster!r} (the config has: {', '.join(clusters)})",
            file=sys.stderr,
        )
        return 2
    source = args.config or "<embedded default.yaml>"
    try:
        body, note = asyncio.run(
            _review(
                config,
                source,
                token,
                API_VERSIONS[args.api_version],
                tuple(args.audience),
                cluster,
            )
        )
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug of ours; its message may quote the config or token
        print(f"{source}: cannot review: {unexpected(exc)}", file=sys.stderr)
        return 1
    sys.stdout.write(orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode() + "\n")
    print(note, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "serve": cmd_serve,
        "check-config": cmd_check_config,
        "review": cmd_review,
        "admin": admin_cli.cmd_admin,
    }
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        return 130  # Ctrl-C (waiting for a token on stdin, say): no traceback to show
    except Exception as exc:  # what each command did not foresee is still one line
        print(f"authn-gateway {args.command}: {unexpected(exc)}", file=sys.stderr)
        return 1
