"""No config file ends in a traceback (issue 36, item 3): YAML nested 5,000 deep, a
5,001-digit integer, alias bombs, values no constructor builds, control characters,
huge files and secret files. Each is a ConfigError of one line that says where, never
quoting the text: with either YAML loader (safe_yaml's Python one and its libyaml one).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import yaml

from authn_gateway.config import ConfigError, load_config, parse_config, safe_yaml
from authn_gateway.config.safe_yaml import MAX_BYTES, MAX_DEPTH, MAX_NODES
from tests.support.config_helpers import MINIMAL, STRONG
from tests.support.hostile_files import KINDS, make_hostile, refusal

SECRETISH = "Zq9sEcReTvAlUe"
LOADERS = [safe_yaml.SafeConfigLoader] + (
    [safe_yaml.FastConfigLoader] if yaml.__with_libyaml__ else []
)


@pytest.fixture(autouse=True, params=LOADERS, ids=lambda loader: loader.__name__)
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type[object]:
    """Each test with each loader: PyYAML's parser in Python, and libyaml's (what
    safe_yaml.load uses when PyYAML has it) under the same checks (docs/decisions.md)."""
    monkeypatch.setattr(safe_yaml, "LOADER", request.param)
    return request.param  # type: ignore[no-any-return]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    assert str(err.value).startswith("gw.yaml: ")
    return err.value.problems


def laughs(levels: int) -> str:
    """The billion laughs: each anchor holds nine of the one before (9**levels values)."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        MINIMAL + "audiences: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
        MINIMAL + "audiences:\n" + "".join("  " * (i + 1) + "- \n" for i in range(200)),
    ],
    ids=["flow-lists", "flow-mappings", "block-lists"],
)
def test_yaml_nested_deeper_than_the_bound_is_one_line(text: str) -> None:
    [problem] = problems(text)
    assert problem.startswith("line "), problem
    assert problem.endswith(f"nested more than {MAX_DEPTH} levels deep"), problem


def test_nesting_within_the_bound_reaches_the_schema() -> None:
    [problem] = problems(MINIMAL + "audiences: " + "[" * 30 + "]" * 30 + "\n")
    assert problem.startswith("audiences[0]: Input should be a valid string"), problem


@pytest.mark.parametrize("field", ["review_deadline_seconds", "server.port", "secret"])
def test_an_integer_of_5001_digits_is_one_line_naming_the_field(field: str) -> None:
    top, _, leaf = field.rpartition(".")
    value = "1" * 5001
    text = MINIMAL + (f"{top}:\n  {leaf}: {value}\n" if top else f"{leaf}: {value}\n")
    [problem] = problems(text)
    assert problem.startswith(f"{field}: "), problem
    assert "1" * 20 not in problem


def test_an_integer_of_5001_digits_as_a_key_is_one_line() -> None:
    [problem] = problems(MINIMAL + "audiences: {" + "7" * 5001 + ": 1}\n")
    assert "7" * 20 not in problem


def test_the_billion_laughs_is_refused_before_anything_is_built() -> None:
    [problem] = problems(MINIMAL + laughs(9))
    assert problem.endswith(f"aliases expand to more than {MAX_NODES} values"), problem
    assert problem.startswith("line "), problem


def test_aliases_under_the_bound_are_read_as_yaml_reads_them() -> None:
    text = MINIMAL + "x: &aud [a, b]\naudiences: *aud\n"
    assert problems(text) == ["x: Extra inputs are not permitted"]
    assert parse_config(MINIMAL + "audiences: &a [x]\n", "gw.yaml").audiences == ["x"]


@pytest.mark.parametrize("text", ["audiences: &a [*a]\n", "server: &s {ops: *s}\n"])
def test_an_alias_inside_its_own_anchor_is_one_line(text: str) -> None:
    [problem] = problems(MINIMAL + text)
    assert problem.endswith("an alias refers to its own anchor (a cycle)"), problem


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("2001-13-45", "timestamp"),
        (f"!!int {SECRETISH}", "int"),
        (f"!!float {SECRETISH}", "float"),
        (f"!!bool {SECRETISH}", "bool"),
    ],
)
def test_a_value_no_constructor_builds_is_one_line_at_its_place(value: str, kind: str) -> None:
    [problem] = problems(MINIMAL + f"secret: {value}\n")
    assert problem == f"line 6, column 9: not a valid {kind} (quote it to mean text)"


def test_a_list_as_a_key_is_one_line() -> None:
    [problem] = problems(MINIMAL + "? [a, b]\n: 1\n")
    assert problem.startswith("line 6"), problem


@pytest.mark.parametrize("char", ["\x00", "\x07", "\ud800", "\x1b"])
def test_a_control_character_or_a_surrogate_is_one_line(char: str) -> None:
    [problem] = problems(MINIMAL + f"secret: {SECRETISH}{char}{SECRETISH}\n")
    assert f"character {ord(char):#06x} at offset " in problem, problem
    assert SECRETISH not in problem


def test_text_larger_than_the_bound_is_one_line() -> None:
    text = MINIMAL + "#" * MAX_BYTES + "\n"
    assert problems(text) == [f"larger than {MAX_BYTES // 1024} KiB: not a config file"]


def test_a_file_that_never_ends_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Path("/dev/zero"))
    assert err.value.problems == ["a character device, not a regular file"]


def test_a_config_file_larger_than_the_bound_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(MINIMAL + "#" * MAX_BYTES + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: larger than {MAX_BYTES // 1024} KiB: not a config file"


def _load_in_a_thread(path: Path) -> BaseException | None:
    """What load_config raises for ``path``, run where a hang cannot stop the tests: a
    thread that is still blocked after a minute fails the test (it was: the FIFO's
    open waited for a writer)."""
    found: list[BaseException | None] = []

    def run() -> None:
        try:
            load_config(path)
            found.append(None)
        except BaseException as exc:  # handed to the test
            found.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert found, f"load_config({path}) is still blocked"
    return found[0]


@pytest.mark.parametrize("kind", [*KINDS, "socket"])
def test_a_config_file_that_is_not_a_regular_file_is_one_line_naming_it(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "gw.yaml"
    if kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
            sock.listen()
            err = _load_in_a_thread(path)
        expected = "a socket, not a regular file"
    else:
        make_hostile(kind, path)
        err = _load_in_a_thread(path)
        expected = refusal(kind, MAX_BYTES)
        if kind == "huge":
            expected = f"larger than {MAX_BYTES // 1024} KiB: not a config file"
    assert isinstance(err, ConfigError), err
    assert str(err) == f"{path}: {expected}"


def test_a_file_name_with_a_nul_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Path("gw\x00.yaml"))
    assert err.value.problems == ["cannot read: not a file name"]


def test_a_secret_file_that_never_ends_is_one_line() -> None:
    [problem] = problems(MINIMAL + "secret: file:/dev/zero\n")
    assert problem == "secret: secret file /dev/zero: a character device, not a regular file"


def test_a_secret_file_within_the_bound_is_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(STRONG + "\n")
    config = parse_config(MINIMAL + f"secret: file:{secret}\n", "gw.yaml")
    assert config.secret is not None
    assert config.secret.get_secret_value() == STRONG


@pytest.mark.parametrize(
    "text",
    [
        "\ufeff" + MINIMAL,  # a byte-order mark: YAML allows it
        MINIMAL + "---\n",  # an empty second document? not one document
        MINIMAL + "audiences: !!set {a, b}\n",
        MINIMAL + "audiences: !!binary '***'\n",
        MINIMAL + "server: {<<: 1}\n",
        MINIMAL + "audiences: !!omap [1]\n",
        MINIMAL + "review_deadline_seconds: " + ":".join(["59"] * 3000) + "\n",
        MINIMAL + "review_deadline_seconds: 0x" + "f" * 5000 + "\n",
    ],
)
def test_odd_but_well_formed_yaml_is_a_config_or_clean_lines(text: str) -> None:
    try:
        parse_config(text, "gw.yaml")
    except ConfigError as err:
        assert all(p and "\n" not in p for p in err.problems), err.problems
        assert not any("unexpected" in p for p in err.problems), err.problems


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # Found by the config fuzz: a key holding a line break made two lines of one.
        ('"\\x1E": null\n', "'\\x1e': Extra inputs are not permitted"),
        ('"a\\u2028b": null\n', "'a\\u2028b': Extra inputs are not permitted"),
        ("? ''\n: null\n", "'': Extra inputs are not permitted"),
        ('"' + "k" * 100 + '": 1\n', f"'{'k' * 64}'...: Extra inputs are not permitted"),
    ],
)
def test_an_odd_key_is_quoted_and_stays_on_its_line(text: str, problem: str) -> None:
    assert problems(MINIMAL + text) == [problem]


def test_a_type_tag_with_a_line_break_stays_on_its_line() -> None:
    [problem] = problems('backends:\n  - {name: x, type: "a\\nb"}\n')
    assert "\n" not in problem and problem.startswith("backends[0]: "), problem


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # Found by the config fuzz: check-config said ok, serve's start-up raised.
        ("server.audit_log", "9" * 4301, "longer than 4095 bytes"),
        ("server.audit_log", "/tmp/" + "n" * 256, "has a name longer than 255 bytes"),
        ("server.audit_log", "a\x00b", "must not contain a NUL character"),
        ("server.audit_log", "", "must name a file"),
        ("deny_list.file", "d\x00", "must not contain a NUL character"),
        ("server.tls.cert_file", "c\x00", "must not contain a NUL character"),
    ],
)
def test_a_file_name_open_cannot_take_is_one_line_naming_the_field(
    field: str, value: str, message: str
) -> None:
    section, *rest = field.split(".")
    doc: dict[str, object] = yaml.safe_load(MINIMAL)
    node: dict[str, object] = doc.setdefault(section, {})  # type: ignore[assignment]
    if rest[0] == "tls":
        node["tls"] = node = {"cert_file": "/c.pem", "key_file": "/k.pem"}
        rest = rest[1:]
    node[rest[0]] = value
    assert problems(yaml.safe_dump(doc)) == [f"{field}: {message}"]


def test_the_loaders_read_the_shipped_configs_alike() -> None:
    root = Path(__file__).resolve().parents[2]
    shipped = [root / "config" / "gateway.yaml", *sorted((root / "deploy").rglob("gateway.yaml"))]
    assert len(shipped) > 2
    for path in shipped:
        text = path.read_text()
        read = [yaml.load(text, Loader=loader) for loader in LOADERS]
        assert all(r == read[0] for r in read), path


def test_a_file_with_no_anchor_is_not_walked_for_aliases_and_one_with_them_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked: list[object] = []
    real = safe_yaml._expanded_size
    monkeypatch.setattr(safe_yaml, "_expanded_size", lambda node: walked.append(node) or real(node))
    parse_config(MINIMAL, "gw.yaml")
    assert walked == []
    parse_config(MINIMAL + "audiences: &a [x]\n", "gw.yaml")
    assert len(walked) == 1
