"""A config file to a :class:`GatewayConfig`, or a :class:`ConfigError` whose lines
name the file and the field."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from authn_gateway.config.safe_yaml import MAX_BYTES, TOO_LARGE, yaml_problem
from authn_gateway.config.safe_yaml import load as load_yaml
from authn_gateway.config.schema import BACKEND_TYPES, GatewayConfig
from backends.files import FileRefused, read_text

EMBEDDED_DEFAULT = "default.yaml"


#: Problems a :class:`ConfigError` lists; past them, one more line counts the rest (a
#: list of 100,000 invalid items is 51 lines, not 100,000).
MAX_PROBLEMS = 50


class ConfigError(Exception):
    """Invalid configuration. ``str()`` is one line per problem, never a secret value:
    the first :data:`MAX_PROBLEMS`, then ``... and K more problems`` if there are more
    (``more``: problems found but not passed in ``problems``)."""

    def __init__(self, source: str, problems: list[str], more: int = 0) -> None:
        self.source = one_line(source)
        self.problems = [one_line(p) for p in problems[:MAX_PROBLEMS]]
        more += max(0, len(problems) - MAX_PROBLEMS)
        if more:
            self.problems.append(f"... and {more} more problem{'s' if more > 1 else ''}")
        super().__init__("\n".join(f"{self.source}: {p}" for p in self.problems))


def one_line(text: str) -> str:
    """``text`` with what is not printable escaped: a key or tag from the file may hold a
    line break (``\\n``, ``\\x1e``, ``\\u2028``), and a problem is one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


#: A key from the file shown as it is; any other is quoted (an empty or odd key, cut).
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _key(item: str) -> str:
    return (
        item if _PLAIN_KEY.fullmatch(item) else repr(item[:64]) + ("..." if len(item) > 64 else "")
    )


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
            else:
                parts.append(f"[{item}]")
            continue
        # Discriminated unions add the type tag to the location; it is noise to a reader.
        if i > 0 and isinstance(loc[i - 1], int) and item in BACKEND_TYPES:
            continue
        parts.append(_key(str(item)))
    return ".".join(parts)


def _format_errors(exc: ValidationError) -> list[str]:
    """The first :data:`MAX_PROBLEMS` of pydantic's errors, each as a line."""
    problems = []
    for err in exc.errors(include_input=False, include_url=False)[:MAX_PROBLEMS]:
        path = _field_path(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        problems.append(f"{path}: {msg}" if path else msg)
    return problems


#: The one line for an exception nothing above classifies: a bug (tests fail on it),
#: said without its message, which may quote the file.
UNEXPECTED = "cannot be checked: unexpected {} (please report this)"


def parse_config(text: str, source: str) -> GatewayConfig:
    """The config ``text`` holds, or :class:`ConfigError`: whatever ``text`` is."""
    try:
        return _parse(text, source)
    except ConfigError:
        raise
    except Exception as exc:  # no config file ends in a traceback
        raise ConfigError(source, [UNEXPECTED.format(type(exc).__name__)]) from None


def _parse(text: str, source: str) -> GatewayConfig:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [yaml_problem(exc)]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["top level must be a mapping"])
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = _format_errors(exc)
        raise ConfigError(source, problems, more=exc.error_count() - len(problems)) from None


def load_config(path: Path | None) -> GatewayConfig:
    """Load and validate ``path``, or the embedded default when ``path`` is None."""
    if path is None:
        text = resources.files("authn_gateway").joinpath(EMBEDDED_DEFAULT).read_text()
        return parse_config(text, f"<embedded {EMBEDDED_DEFAULT}>")
    try:
        # The one bounded reader of files (backends/files.py): a regular file of at most
        # MAX_BYTES. A FIFO, a device (/dev/zero), a directory or a socket is refused in
        # one line before it is read, and a FIFO swapped in after the stat cannot block
        # the open (O_NONBLOCK): neither check-config nor a SIGHUP reload waits on one.
        text = read_text(path, MAX_BYTES)
    except FileRefused as exc:
        reason = TOO_LARGE if exc.too_large else exc.reason
        raise ConfigError(str(path), [reason]) from None
    return parse_config(text, str(path))
