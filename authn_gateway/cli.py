"""Command line: ``authn-gateway serve | check-config | review | admin``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson

from . import __version__, admin_cli
from .config import ConfigError, GatewayConfig, load_config
from .logsetup import configure_logging
from .tokenreview import API_VERSIONS, describe, render_verdict


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")

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
    admin_cli.add_parser(sub)
    return parser


def _load(path: Path | None) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return None


def _apply_overrides(config: GatewayConfig, host: str | None, port: int | None) -> GatewayConfig:
    server = config.server.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    return config.model_copy(update={"server": server})


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    config = _apply_overrides(config, args.host, args.port)
    configure_logging(config.logging.level, config.logging.format)
    from .server import serve

    return serve(config, args.config)


async def _build_and_close(config: GatewayConfig, source: str) -> None:
    """Construct every backend (token files, CA bundles), then release what they opened."""
    from .gateway import build_backends

    for backend in build_backends(config, source):
        await backend.close()


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 1
    try:
        asyncio.run(_build_and_close(config, str(args.file)))
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
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
) -> tuple[bytes, str]:
    from .gateway import Gateway

    gateway = Gateway(config, source=str(source))
    await gateway.start()
    try:
        verdict = await gateway.pipeline.review(token, audiences, caller="cli")
    finally:
        await gateway.close()
    return render_verdict(api_version, verdict, gateway.markers).body, describe(verdict)


def cmd_review(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    configure_logging("warning", config.logging.format)
    token = sys.stdin.readline().strip() if args.token == "-" else args.token
    if not token:
        print("no token given (argument or stdin)", file=sys.stderr)
        return 2
    source = args.config or "<embedded default.yaml>"
    try:
        body, note = asyncio.run(
            _review(config, source, token, API_VERSIONS[args.api_version], tuple(args.audience))
        )
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
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
    return commands[args.command](args)
