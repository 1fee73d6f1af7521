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
from authn_gateway.config.loading import MAX_PROBLEMS
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


EXPANDS = f"expands to more than {MAX_NODES} nodes (an alias counts as a copy of its anchor)"


def test_the_billion_laughs_is_refused_before_anything_is_built() -> None:
    [problem] = problems(MINIMAL + laughs(9))
    assert problem.endswith(EXPANDS), problem
    assert problem.startswith("line "), problem


def test_a_small_file_whose_aliases_expand_to_480k_items_is_one_line() -> None:
    # 70 KB of YAML whose aliases made 480,000 list items: 480,004 problem lines (40 MB),
    # 774 MB of memory and 7 s, when only a million values were refused.
    chunk = "[" + ", ".join(["x"] * 1000) + "]"
    text = MINIMAL + f"a: &a {chunk}\n" + "audiences: [" + ", ".join(["*a"] * 480) + "]\n"
    [problem] = problems(text)
    assert problem.startswith("line "), problem
    assert problem.endswith(EXPANDS), problem


def test_a_file_without_aliases_is_held_to_the_same_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Aliases add no new worst case: a plain 1 MiB list of 500,000 items cost as much.
    monkeypatch.setattr(safe_yaml, "MAX_NODES", 1000)
    text = MINIMAL + "audiences: [" + ",".join(["1"] * 1000) + "]\n"
    [problem] = problems(text)
    assert problem.startswith("line 6, column "), problem
    assert problem.endswith(
        "expands to more than 1000 nodes (an alias counts as a copy of its anchor)"
    )


def test_aliases_nested_past_the_depth_bound_are_one_line() -> None:
    # Each anchor nests the one before 25 levels deeper: the third is 77 levels deep
    # once copied, where no line of the file is nested more than 26.
    deep = "[" * 25 + "{}" + "]" * 25
    text = MINIMAL + "".join(
        f"a{i}: &a{i} " + deep.replace("{}", f"*a{i - 1}" if i else "x") + "\n" for i in range(3)
    )
    [problem] = problems(text)
    assert problem.startswith("line 8, column "), problem
    assert problem.endswith(f"nested more than {MAX_DEPTH} levels deep"), problem


@pytest.mark.parametrize("alias", [False, True])
def test_a_document_of_exactly_the_bound_reaches_the_schema(
    monkeypatch: pytest.MonkeyPatch, alias: bool
) -> None:
    monkeypatch.setattr(safe_yaml, "MAX_NODES", 1000)
    # MINIMAL is 15 nodes: the root, backends and its value (13); audiences is 2 more,
    # its key and its list, and the items.
    items = ["x"] * (1000 - 17)
    if alias:  # the same items, through an anchor (x:) and an alias, counted twice
        items = items[: (1000 - 17 - 2) // 2]
        text = MINIMAL + f"x: &a [{','.join(items)}]\naudiences: *a\n"
        with pytest.raises(ConfigError, match="x: Extra inputs are not permitted"):
            parse_config(text, "gw.yaml")
        over = MINIMAL + f"x: &a [{','.join([*items, 'x'])}]\naudiences: *a\n"
    else:
        text = MINIMAL + f"audiences: [{','.join(items)}]\n"
        assert parse_config(text, "gw.yaml").audiences == items
        over = MINIMAL + f"audiences: [{','.join([*items, 'x'])}]\n"
    [problem] = problems(over)
    assert problem.endswith(
        "expands to more than 1000 nodes (an alias counts as a copy of its anchor)"
    )


def test_a_file_of_100k_invalid_items_is_50_problems_and_a_count_of_the_rest() -> None:
    text = MINIMAL + "audiences: [" + ",".join(["1"] * 100_000) + "]\n"
    lines = problems(text)
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[:2] == [f"audiences[{i}]: Input should be a valid string" for i in (0, 1)]
    assert lines[-1] == f"... and {100_000 - MAX_PROBLEMS} more problems"


def test_aliases_within_the_bound_expand_to_as_many_problems_and_are_counted() -> None:
    chunk = "[" + ", ".join(["1"] * 100) + "]"
    text = MINIMAL + f"x: &a {chunk}\naudiences: *a\nprevious_secrets: *a\n"
    lines = problems(text)
    assert len(lines) == MAX_PROBLEMS + 1
    # x (not a field), each of the 100 copies in audiences, and previous_secrets (at
    # most 3 items): 102 problems.
    assert lines[-1] == f"... and {102 - MAX_PROBLEMS} more problems", lines[-1]


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


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # "cannot be read as YAML (TypeError)", with no place at all.
        ("server: !!map [1, 2]", "line 6, column 9: expected a mapping, but found a list"),
        ("audiences: !!set [a]", "line 6, column 12: expected a mapping, but found a list"),
        ("server: !!map x", "line 6, column 9: expected a mapping, but found a single value"),
    ],
)
def test_a_mapping_tag_on_what_is_no_mapping_is_one_line_at_its_place(
    text: str, problem: str
) -> None:
    assert problems(MINIMAL + text + "\n") == [problem]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # `yes: 1` was "[1]: Keys should be strings", a boolean key shown as a list index.
        ("yes: 1", "line 6, column 1: key 'yes' reads as a boolean"),
        ("server:\n  port: 8080\n  on: 1", "line 8, column 3: key 'on' reads as a boolean"),
        ("1: 2", "line 6, column 1: key '1' reads as a number"),
        ("0x1f: 2", "line 6, column 1: key '0x1f' reads as a number"),
        ("3.5: x", "line 6, column 1: key '3.5' reads as a number"),
        ("~: 1", "line 6, column 1: key '~' reads as null"),
        ("server: {null: 1}", "line 6, column 10: key 'null' reads as null"),
        ("2001-01-01: x", "line 6, column 1: key '2001-01-01' reads as a date"),
        (f"{'9' * 40}: x", "line 6, column 1: key of 40 characters reads as a number"),
    ],
)
def test_a_key_that_reads_as_no_text_is_said_as_written_at_its_line(
    text: str, problem: str
) -> None:
    [line] = problems(MINIMAL + text + "\n")
    assert line == f"{problem}, not text: quote it to mean the text", line


def test_a_quoted_key_is_text() -> None:
    assert problems(MINIMAL + "'yes': 1\n") == ["yes: Extra inputs are not permitted"]


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
