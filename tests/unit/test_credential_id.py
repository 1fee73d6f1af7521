"""One credential, one id (issue 36): the token id the review log shows, the deny list
checks and cache entries carry is of the credential the backend reads, whatever route
the token took (a prefix stripped or not, the chain, a prefixed backend also in the
chain, backends under different prefixes) and however it was spelled (an LDAP name's
case, width and spaces, a password SASLprep binds as the same bytes, base64's unused
bits; a Keystone fernet token's padding, alphabet and skipped characters).

Properties over generated routes and spellings (hypothesis), against a real slapd,
which says that each spelling is the same credential: it authenticates as the user,
and once the id is denied the directory sees no more binds."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ldap3.core.exceptions import LDAPException
from ldap3.protocol.sasl.sasl import validate_simple_password

from authn_gateway.config import parse_config
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.review.pipeline import DENIED
from authn_gateway.revocation.subject import Subject
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated, Rejected, Verdict
from backends.keystone.fernet import canonical_fernet
from backends.ldap import canonical_token, folded_name
from tests.support.credential_id_helpers import (
    FULL_WIDTH,
    MAPPED_TO_NOTHING,
    SECRET,
    ldap_backend,
    ldap_token,
    other_trailing_bits,
)
from tests.support.procs import free_port
from tests.support.slapd import USERS, Slapd

#: Routes to the directory: a prefix stripped (the backend also in the chain), the
#: chain, another backend's prefix, and which backend's cache each one fills.
LDAP_ROUTES = {"s-": "corp", "": "corp", "m-": "mirror"}
#: In the directory, with names full of what escaping and folding must get right.
LOGINS = ("alice", "bob", "ann,lee+x=1", "star*")
OPAQUE = "opaque-Zq7Wm2Kx9Lv4Rt8Nb3Hc6Jf1Gd5Ps0Ye"


class Running:
    """A gateway in process, on one event loop of its own (hypothesis runs each
    example synchronously)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.runner = asyncio.Runner()
        self.gateway = self.runner.run(self._start(config))

    async def _start(self, config: dict[str, Any]) -> Gateway:
        gateway = Gateway(parse_config(yaml.safe_dump(config), "test.yaml"))
        await gateway.start()
        return gateway

    def review(self, token: str) -> Verdict:
        return self.runner.run(self.gateway.pipeline.review(token, (), "test"))

    def token_id(self, token: str, cluster: str | None = None) -> str:
        return self.gateway.pipeline.token_id(token, cluster)

    def deny(self, token_id: str) -> None:
        actions = self.gateway.revocations
        self.runner.run(actions.deny(Subject("token", token_id), 600, by="test"))

    def lift(self, token_id: str) -> None:
        self.runner.run(self.gateway.revocations.lift(Subject("token", token_id), by="test"))

    def evict(self, token_id: str) -> int:
        answer = self.runner.run(
            self.gateway.revocations.evict(Subject("token", token_id), by="test")
        )
        return int(answer["local_entries"])

    def close(self) -> None:
        self.runner.run(self.gateway.close())
        self.runner.close()


def config(directory: Slapd, password_file: Path, **top: Any) -> dict[str, Any]:
    closed = free_port()  # Keystone is never reached: its reviews are denied or absent
    return {
        "secret": SECRET,
        "cache": {"negative_ttl_seconds": 0},
        "backends": [
            ldap_backend(directory, password_file, "corp", prefix="s-", strip_prefix=True,
                         in_chain=True),
            ldap_backend(directory, password_file, "mirror", prefix="m-", strip_prefix=True),
            {"name": "ks", "type": "keystone", "auth_url": f"http://127.0.0.1:{closed}",
             "service": {"username": "gw", "password": "pw", "system_scope": "all"},
             "fernet_precheck": True,
             "prefix": "ks-", "strip_prefix": True, "in_chain": True},
            {"name": "kn", "type": "keystone", "auth_url": f"http://127.0.0.1:{closed}",
             "service": {"username": "gw", "password": "pw", "system_scope": "all"},
             "fernet_precheck": False, "prefix": "kn-", "strip_prefix": True},
            {"name": "chained", "type": "static", "prefix": "c-", "strip_prefix": True,
             "in_chain": True, "tokens": [{"token": OPAQUE, "username": "carl"}]},
            {"name": "whole", "type": "static", "prefix": "n-",
             "tokens": [{"token": "n-" + OPAQUE, "username": "nina"}]},
        ],
        **top,
    }  # fmt: skip


@pytest.fixture(scope="module")
def directory(module_slapd: Slapd) -> Slapd:
    return module_slapd


@pytest.fixture(scope="module")
def gw(directory: Slapd, service_password_file: Path) -> Iterator[Running]:
    running = Running(config(directory, service_password_file))
    yield running
    running.close()


# ---- spellings -----------------------------------------------------------------------


@st.composite
def spelled_name(draw: st.DrawFn, login: str) -> str:
    """A spelling the directory matches to ``login``: case, full width, a dotted capital
    I, spaces around it (OpenLDAP's uid matching, RFC 4518)."""
    out = []
    for ch in login:
        forms = [ch, ch.swapcase(), FULL_WIDTH.get(ch, ch)] + (["\u0130"] if ch == "i" else [])
        out.append(draw(st.sampled_from(forms)))
    around = st.text(alphabet=" ", max_size=2)
    return draw(around) + "".join(out) + draw(around)


@st.composite
def spelled_password(draw: st.DrawFn, password: str) -> str:
    """A spelling the bind sends as ``password`` (SASLprep: NFKC, table B.1 mapped to
    nothing)."""
    out = []
    for ch in password:
        extra = draw(st.sampled_from(("", *MAPPED_TO_NOTHING)))
        out.append(extra + draw(st.sampled_from([ch, FULL_WIDTH.get(ch, ch)])))
    return "".join(out)


@st.composite
def sent_spelling(draw: st.DrawFn, login: str) -> str:
    """One credential of ``login``'s, spelled and routed some way."""
    name, password = draw(spelled_name(login)), draw(spelled_password(USERS[login].password))
    encoded = ldap_token(name, password)
    if draw(st.booleans()):
        encoded = other_trailing_bits(encoded, draw(st.integers(min_value=1, max_value=3)))
    return draw(st.sampled_from(sorted(LDAP_ROUTES))) + encoded


def _cache_entry(sent: str) -> tuple[str, str]:
    """The backend whose cache a routed LDAP token fills, and the token it sees (base64
    holds no "-")."""
    prefix, _, rest = sent.rpartition("-")
    return LDAP_ROUTES[prefix + "-" if prefix else ""], rest


def _authenticated_as(verdict: Verdict, login: str) -> bool:
    outcome = verdict.outcome
    return isinstance(outcome, Authenticated) and outcome.user.username == login


def _denied(verdict: Verdict) -> bool:
    return isinstance(verdict.outcome, Rejected) and verdict.outcome.reason == DENIED


# ---- LDAP: spellings and routes, against the directory ------------------------------


@settings(max_examples=25)
@given(data=st.data())
def test_every_spelling_on_every_route_is_one_id_and_one_denial_refuses_them_all(
    gw: Running, directory: Slapd, data: st.DataObject
) -> None:
    login = data.draw(st.sampled_from(LOGINS))
    sent = data.draw(st.lists(sent_spelling(login), min_size=2, max_size=3, unique=True))
    expected = gw.token_id(ldap_token(login, USERS[login].password))
    assert {gw.token_id(s) for s in sent} == {expected}, sent
    gw.evict(expected)  # what earlier examples left
    try:
        for s in sent:
            # The directory takes each for the user's own name and password.
            assert _authenticated_as(gw.review(s), login), s
        gw.deny(expected)
        binds = directory.operations("Bind")
        for s in sent:
            assert _denied(gw.review(s)), s
        assert directory.operations("Bind") == binds  # refused before anyone asked it
    finally:
        gw.lift(expected)
        # Every cached answer carries the one id: one eviction reaches them all.
        evicted = gw.evict(expected)
    assert evicted == len({_cache_entry(s) for s in sent}), (sent, evicted)
    binds = directory.operations("Bind")
    assert _authenticated_as(gw.review(sent[0]), login)
    assert directory.operations("Bind") == binds + 1  # evicted: the directory is asked


def test_the_issue_36_case_a_stripped_prefix_and_the_chain_are_one_credential(
    gw: Running, directory: Slapd
) -> None:
    bare = ldap_token("alice", USERS["alice"].password)
    assert gw.token_id("s-" + bare) == gw.token_id(bare)
    assert gw.token_id("s-" + bare) != TokenHasher(SECRET.encode()).token_id("s-" + bare)
    for sent in ("s-" + bare, bare, "c-" + OPAQUE, OPAQUE):
        assert isinstance(gw.review(sent).outcome, Authenticated), sent
    gw.deny(gw.token_id("s-" + bare))
    gw.deny(gw.token_id("c-" + OPAQUE))
    try:
        for sent in ("s-" + bare, bare, "m-" + bare, "c-" + OPAQUE, OPAQUE):
            assert _denied(gw.review(sent)), sent
    finally:
        gw.lift(gw.token_id(bare))
        gw.lift(gw.token_id(OPAQUE))


def test_a_prefix_that_is_not_stripped_is_part_of_the_credential(gw: Running) -> None:
    whole = "n-" + OPAQUE  # the static backend "whole" sees (and knows) it with its prefix
    assert gw.token_id(whole) == TokenHasher(SECRET.encode()).token_id(whole)
    assert gw.token_id(whole) != gw.token_id(OPAQUE)
    gw.deny(gw.token_id(OPAQUE))
    try:
        assert _authenticated_as(gw.review(whole), "nina")
    finally:
        gw.lift(gw.token_id(OPAQUE))


ROUTED = ("s-", "m-", "c-", "n-", "ks-", "kn-")


@given(token=st.text(min_size=1, max_size=40).filter(lambda t: not t.startswith(ROUTED)))
def test_one_string_stripped_of_any_prefix_has_the_id_it_has_on_the_chain(
    gw: Running, token: str
) -> None:
    """What the backend sees decides, whichever backend: an id denied refuses the string
    wherever a prefix routes it (no backend ever sees the prefix it strips). A backend
    that could not accept the string ("ks"'s fernet precheck: under 119 characters) never
    sees it, so its reading is no one's: the string stands as sent (CI's failing case was
    ``gB``, which Keystone would read as ``gA``)."""
    ids = {gw.token_id(prefix + token) for prefix in ("", "s-", "m-", "c-", "ks-")}
    assert len(ids) == 1, token
    assert gw.token_id("n-" + token) == TokenHasher(SECRET.encode()).token_id("n-" + token)
    # Without the precheck Keystone is sent any visible ASCII, and reads it as it does.
    if gw.gateway.pipeline.backends["kn"].top.could_accept(token):
        expected = TokenHasher(SECRET.encode()).token_id(canonical_fernet(token))
        assert gw.token_id("kn-" + token) == expected, token


def test_a_chain_member_that_could_not_accept_a_token_does_not_read_it(gw: Running) -> None:
    """``gB`` decodes to a fernet version byte, so Keystone would read it as ``gA``; but
    "ks" checks fernet tokens' form first and is never asked, and the static member
    that is asked reads it as sent: the chain's id is the static member's."""
    assert canonical_fernet("gB") == "gA"
    plain = TokenHasher(SECRET.encode()).token_id("gB")
    assert gw.token_id("gB") == gw.token_id("c-gB") == gw.token_id("ks-gB") == plain
    assert gw.token_id("kn-gB") == TokenHasher(SECRET.encode()).token_id("gA")


def test_a_cluster_refused_a_backend_logs_its_tokens_under_the_ids_they_have_elsewhere(
    directory: Slapd, service_password_file: Path
) -> None:
    """Issue 37's routers per cluster: a prefix to a backend the cluster may not use is
    refused without a call, under the id the backend's own reading gives."""
    restricted = {"clusters": [{"name": "default", "backends": ["corp", "chained", "whole"]}]}
    running = Running(config(directory, service_password_file, **restricted))
    try:
        bare = ldap_token("alice", USERS["alice"].password)
        sent = "m-" + ldap_token("ALICE ", USERS["alice"].password)
        assert running.token_id(sent, "default") == running.token_id(bare, "default")
        verdict = running.review(sent)
        assert isinstance(verdict.outcome, Rejected) and "may not use" in verdict.outcome.reason
    finally:
        running.close()


# ---- rotation and ids from before issue 36 ---------------------------------------------


@pytest.fixture(scope="module")
def rotated(directory: Slapd, service_password_file: Path) -> Iterator[Running]:
    """The gateway after a rotation: a new secret, the old one still read."""
    running = Running(
        config(directory, service_password_file, secret=SECRET + "-next",
               previous_secrets=[SECRET])
    )  # fmt: skip
    yield running
    running.close()


def test_a_denial_made_under_the_previous_secret_refuses_every_spelling(
    rotated: Running,
) -> None:
    old = TokenHasher(SECRET.encode())
    bare = ldap_token("bob", USERS["bob"].password)
    before = old.token_id(canonical_token(bare))  # what the log showed before the rotation
    rotated.deny(before)
    try:
        for sent in ("s-" + bare, bare, "m-" + ldap_token(" BOB", USERS["bob"].password)):
            assert _denied(rotated.review(sent)), sent
    finally:
        rotated.lift(before)
        rotated.lift(rotated.token_id(bare))  # the denial was carried to the new id


def test_a_denial_of_the_id_a_stripped_token_had_before_is_carried_to_its_new_id(
    rotated: Running,
) -> None:
    """Upgrading: a denial made with the id the log showed for ``c-X`` (of the token as
    sent) refuses ``c-X`` still, and from its first refusal ``X`` too."""
    legacy = TokenHasher((SECRET + "-next").encode()).token_id("c-" + OPAQUE)
    assert legacy != rotated.token_id("c-" + OPAQUE)
    rotated.deny(legacy)
    try:
        assert isinstance(rotated.review(OPAQUE).outcome, Authenticated)  # not yet carried
        assert _denied(rotated.review("c-" + OPAQUE))
        assert _denied(rotated.review(OPAQUE))
    finally:
        rotated.lift(legacy)
        rotated.lift(rotated.token_id(OPAQUE))


# ---- Keystone fernet tokens -------------------------------------------------------------


NOT_BASE64 = "!#$%&()*,.:;<>?@[]^`{|}~"


@st.composite
def fernet_spelling(draw: st.DrawFn) -> tuple[str, str]:
    """A fernet token as Keystone issues it, and a spelling Keystone decodes to the same
    bytes (padding by length, then Python's lax url-safe decoder)."""
    raw = b"\x80" + draw(st.binary(min_size=88, max_size=200))
    issued = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    spelled = base64.urlsafe_b64encode(raw).decode()  # padded
    if draw(st.booleans()):
        spelled = other_trailing_bits(spelled.replace("-", "+").replace("_", "/"))
    if draw(st.booleans()):
        spelled = spelled.replace("+", "-").replace("/", "_")
    for _ in range(draw(st.integers(min_value=0, max_value=2))):  # 4 skipped at a time
        at = draw(st.integers(min_value=0, max_value=len(spelled)))
        junk = draw(st.text(alphabet=NOT_BASE64, min_size=4, max_size=4))
        spelled = spelled[:at] + junk + spelled[at:]
    if draw(st.booleans()):
        spelled = spelled.rstrip("=")  # Keystone pads it again by length
    return issued, spelled


def _as_keystone_reads(token: str) -> bytes:
    """keystone.token.token_formatters: restore_padding, then Fernet's decoder."""
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


@given(pair=fernet_spelling(), route=st.sampled_from(("ks-", "kn-", "")))
def test_a_fernet_token_spelled_any_way_keystone_reads_it_has_its_id_and_is_denied(
    gw: Running, pair: tuple[str, str], route: str
) -> None:
    """Every spelling a Keystone is sent has the issued token's id, and its denial refuses
    it. "ks" (and the chain, where "ks" is the only member that re-spells) checks a
    fernet token's form first: a spelling outside it (skipped characters, the standard
    alphabet) reaches no Keystone, keeps its own id and is refused unasked."""
    issued, spelled = pair
    assert _as_keystone_reads(spelled) == _as_keystone_reads(issued)  # one token to Keystone
    assert canonical_fernet(spelled) == issued
    prechecked = gw.gateway.pipeline.backends["ks"].top
    reaches_keystone = route == "kn-" or prechecked.could_accept(spelled)
    plain = TokenHasher(SECRET.encode()).token_id(spelled)
    expected = gw.token_id(issued) if reaches_keystone else plain
    assert gw.token_id(route + spelled) == expected
    assert gw.token_id("ks-" + issued) == gw.token_id("kn-" + issued) == gw.token_id(issued)
    gw.deny(gw.token_id(issued))
    try:
        verdict = gw.review(route + spelled)
        if reaches_keystone:
            assert _denied(verdict)
        else:  # Keystone was not asked; the static member does not know it
            assert isinstance(verdict.outcome, Rejected)
            assert _denied(verdict) == (spelled == issued), spelled  # denied as sent only
    finally:
        gw.lift(gw.token_id(issued))


def test_the_log_shows_the_id_of_the_member_that_answered_and_its_denial_holds_everywhere(
    directory: Slapd, service_password_file: Path
) -> None:
    """A chain whose Keystone (down) would re-spell a string that its static member
    holds: the static member answers, so the review log shows the static credential's
    id, and denying that id refuses the string on the chain and on the static prefix."""
    raw = b"\x80" + bytes(8) + bytes(range(16, 96))  # version, timestamp 0, the rest
    spelled = base64.urlsafe_b64encode(raw).decode()  # padded: Keystone reads it unpadded
    assert canonical_fernet(spelled) != spelled
    settings = config(directory, service_password_file)
    static = next(b for b in settings["backends"] if b["name"] == "chained")
    static["tokens"].append({"token": spelled, "username": "fern"})
    running = Running(settings)
    try:
        pipeline = running.gateway.pipeline

        async def answered() -> tuple[Verdict, str]:
            started = pipeline.start(spelled, (), "test")
            assert not isinstance(started, Verdict)
            target, context = started
            assert target.could_accept(spelled)  # Keystone is asked first (and is down)
            assert context.credential() == canonical_fernet(spelled)  # the chain's reading
            verdict = await target.review(context)
            return verdict, pipeline.credential_read_by(verdict.backend, context)

        verdict, credential = running.runner.run(answered())
        assert _authenticated_as(verdict, "fern") and verdict.backend == "chained"
        logged = running.gateway.hasher.token_id(credential)
        assert logged == TokenHasher(SECRET.encode()).token_id(spelled)
        assert logged == running.token_id("c-" + spelled)
        running.deny(logged)
        for sent in (spelled, "c-" + spelled):
            assert _denied(running.review(sent)), sent
    finally:
        running.close()


def test_jwts_and_other_strings_keep_their_own_spelling_through_keystone() -> None:
    jwt = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"
    for token in (jwt, "glpat-abcdefghijklmnopqrst", "gAAAA!", "g" * 5):
        assert canonical_fernet(token) == token


# ---- the LDAP reading, alone ----------------------------------------------------------


def test_a_directory_spelling_folds_to_the_name_and_the_bound_password() -> None:
    assert folded_name("  ALİCE ") == folded_name("\uff41lice") == "alice"
    canonical = ldap_token("alice", "alice-pw")
    for spelled in (
        ldap_token("ALICE", "alice-pw"),
        ldap_token("alice", "\uff41lice-pw"),
        ldap_token("alice", "al\u00adice-pw"),
        other_trailing_bits(ldap_token("alice", "alice-pw")),
    ):
        assert canonical_token(spelled) == canonical, spelled
    assert canonical_token("alice:pw", "plain") == canonical_token("Alice :pw", "plain")


def _bound(password: str) -> bytes | None:
    """The bytes a simple bind sends for ``password`` (None: no bind can carry it)."""
    try:
        return validate_simple_password(password)
    except LDAPException:
        return None


NAMES = st.text(min_size=1, max_size=12).filter(lambda n: ":" not in n and n.strip() != "")


@given(name=NAMES, other=NAMES, one=st.text(min_size=1), two=st.text(min_size=1))
def test_folding_merges_names_only_another_password_is_another_id(
    name: str, other: str, one: str, two: str
) -> None:
    if _bound(one) == _bound(two):
        return
    assert canonical_token(ldap_token(name, one)) != canonical_token(ldap_token(other, two))


@given(token=st.text(max_size=60))
def test_any_string_has_an_id_and_its_reading_is_stable(gw: Running, token: str) -> None:
    token_id = gw.token_id(token)
    assert len(token_id) == 12 and int(token_id, 16) >= 0
    for fmt in ("base64", "plain"):
        once = canonical_token(token, fmt)
        assert canonical_token(once, fmt) == once
    once = canonical_fernet(token)
    assert canonical_fernet(once) == once
