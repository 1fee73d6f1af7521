"""The policy in force, and the file it is read from again when it changes.

The policy is the own rules (from the config) followed by the keystone policy file's.
The file is checked every ``reload_interval_seconds`` (its modification time, size and
inode: a ConfigMap volume swaps a symlink) and read again when that changed, as the
static backend reads its token file. A change that cannot be used (invalid, unreadable,
gone) is refused in one log line naming the file and the rule, and the policy in force
is kept; so is one that a config reload cannot read, when the file did not move.

Without any policy (the file unreadable or invalid since start-up) no decision can be
made: :attr:`PolicySource.policy` is None and the webhook answers ``on_error``. The
gateway still starts, so that authentication never waits on authorization;
``check-config`` reports the file (cli.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from authn_gateway.authorization.keystone_policy import PolicyError, parse_keystone_policy
from authn_gateway.authorization.metrics import AuthorizationMetrics
from authn_gateway.authorization.own_rules import SOURCE, compile_rules
from authn_gateway.authorization.rules import Policy, Rule, policy_of
from authn_gateway.config.authorization import AuthorizationSettings
from backends.files import POLICY_BYTES, FileRefused, read_file, shown

log = logging.getLogger(__name__)

#: What tells a file changed: (inode, size, modification time in ns); None: unreadable.
Signature = tuple[int, int, int] | None


def signature(path: Path) -> Signature:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def read_policy_file(path: Path) -> tuple[tuple[Rule, ...], tuple[str, ...]]:
    """The file's rules and notes; :class:`PolicyError` naming the file if unusable."""
    try:
        text = read_file(path, POLICY_BYTES)
    except FileRefused as exc:
        raise PolicyError(str(exc)) from None
    try:
        parsed = parse_keystone_policy(text, path.name)
    except PolicyError as exc:
        raise PolicyError(f"{shown(path)}: {exc}") from None
    return parsed.rules, tuple(f"{shown(path)}: {note}" for note in parsed.notes)


class PolicySource:
    def __init__(
        self,
        settings: AuthorizationSettings,
        metrics: AuthorizationMetrics,
        on_change: Callable[[], None],
        report: Callable[[Exception], None],
        previous: PolicySource | None = None,
    ) -> None:
        self.settings = settings
        self.path = settings.keystone_policy_file
        self.metrics = metrics
        self._on_change = on_change
        self._report = report
        self._own = compile_rules(settings.rules)
        self._file_rules: tuple[Rule, ...] = ()
        self.policy: Policy | None = None
        #: Why there is no policy, or why the file's current content is not in force.
        self.error: str | None = None
        self._signature: Signature = None
        self._watcher: asyncio.Task[None] | None = None
        self._first_load(previous)

    def _first_load(self, previous: PolicySource | None) -> None:
        if self.path is None:
            self._install(())
            return
        self._signature = signature(self.path)
        try:
            rules, notes = read_policy_file(self.path)
        except PolicyError as exc:
            if previous is not None and previous.path == self.path and previous.policy:
                # A config reload while the file is broken: its rules in force stay.
                self._install(previous._file_rules)
                self._refused(exc)
            else:
                self._refused(exc)
            return
        self._log_notes(notes)
        self._install(rules)

    def _install(self, file_rules: tuple[Rule, ...]) -> None:
        self._file_rules = file_rules
        parts: list[tuple[str, tuple[Rule, ...]]] = []
        if self._own:
            parts.append((SOURCE, self._own))
        if self.path is not None:
            parts.append((str(self.path), file_rules))
        self.policy = policy_of(parts)
        self.error = None
        self.metrics.rules.set(len(self.policy.rules))
        self.metrics.refused.set(0)
        self._on_change()

    def _refused(self, exc: PolicyError) -> None:
        """The file's content is not in force: one line, the gauge, the policy kept."""
        self.error = str(exc)
        self.metrics.refused.set(1)
        if self.policy is not None:
            log.error("authorization: policy refused, keeping the policy in force: %s", exc)
        else:
            answer = self.settings.on_error
            log.error("authorization: no policy in force (answering %s): %s", answer, exc)

    def _log_notes(self, notes: tuple[str, ...]) -> None:
        for note in notes:
            log.warning("authorization: %s", note)

    def check(self) -> bool:
        """Read the file again if it changed; whether the policy in force changed."""
        if self.path is None:
            return False
        now = signature(self.path)
        if now == self._signature:
            return False
        self._signature = now
        try:
            rules, notes = read_policy_file(self.path)
        except PolicyError as exc:
            self.metrics.reload("refused")
            self._refused(exc)
            return False
        self.metrics.reload("loaded")
        self._log_notes(notes)
        self._install(rules)
        assert self.policy is not None
        log.info("authorization: policy reloaded: %s", self.policy.description)
        return True

    async def start(self) -> None:
        if self.path is not None and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="authorization-policy")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_seconds)
            try:
                self.check()
            except Exception as exc:
                # A bug of ours must not end the watcher: the policy in force stays.
                self._report(exc)
