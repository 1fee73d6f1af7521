"""Files the config names, read whole but bounded: the one reader of every one of them.

A certificate, key, CA bundle, token file, policy file, secret file or deny list is a
regular file of a known kind, and no bigger than that kind gets. Anything else is
refused before it is read: a FIFO (opening one blocks until a writer comes, and
reading it until the writer stops), a device (``/dev/zero`` never ends, ``/dev/tty``
waits for a keystroke), a directory, a socket, or a file past its kind's bound (a 10
GiB file, sparse or not, would be held in memory whole). The refusal is one line
naming the file and why, for the caller to prefix with its field; at start-up that is
a config error, at run time (a watched file replaced) the old content stays in use.

The bounds, by kind, are documented in config/gateway.yaml.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB

#: A secret (``file:PATH``): a password, a token or a key is far below this.
SECRET_BYTES = 64 * KiB
#: A PEM certificate chain, or its private key (a chain is a few KiB).
PEM_BYTES = 1 * MiB
#: A PEM bundle of CAs: the whole Mozilla bundle is about 220 KiB.
CA_BUNDLE_BYTES = 4 * MiB
#: kube's --token-auth-file CSV: about 100 bytes a token, so 160,000 tokens.
TOKEN_FILE_BYTES = 16 * MiB
#: k8s-keystone-auth's policy file (JSON), held in memory whole while it is parsed.
POLICY_BYTES = 16 * MiB
#: The deny list the gateway writes itself (JSON, about 200 bytes an entry).
DENY_LIST_BYTES = 64 * MiB

#: What a file that is not a regular one is, in words.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(Exception):
    """A file that cannot be read as the file it should be. ``str()`` is ``path: why``
    on one line, never quoting the content."""

    def __init__(self, path: Path, reason: str, *, too_large: bool = False) -> None:
        self.path = path
        self.reason = reason
        #: Refused for its size alone (the reader's caller may say that in its own words).
        self.too_large = too_large
        super().__init__(f"{shown(path)}: {reason}")


def shown(path: Path | str) -> str:
    """``path`` for a message of one line: what is not printable escaped."""
    text = str(path)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def size_text(limit: int) -> str:
    """``limit`` bytes in the largest unit it is a whole number of."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if limit >= unit and limit % unit == 0:
            return f"{limit // unit} {name}"
    return f"{limit} bytes"


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result, limit: int | None, pipes: bool = False) -> None:
    if pipes and stat.S_ISFIFO(st.st_mode):
        return  # read up to the bound as it comes
    kind = _not_regular(st.st_mode)
    if kind is not None:
        raise FileRefused(path, f"{kind}, not a regular file")
    if limit is not None and st.st_size > limit:
        raise FileRefused(path, f"larger than {size_text(limit)}", too_large=True)


def check_file(path: Path, limit: int | None, *, pipes: bool = False) -> None:
    """What :func:`read_file` would refuse in ``path`` without reading it: missing,
    unreadable, not a regular file, or larger than ``limit`` (None: any size)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileRefused(path, f"cannot read: {_why(exc)}") from None
    except ValueError:  # a NUL in the name; FilePath fields refuse it before this
        raise FileRefused(path, "cannot read: not a file name") from None
    _check(path, st, limit, pipes)


def read_file(path: Path, limit: int, *, pipes: bool = False) -> bytes:
    """The content of ``path``, a regular file of at most ``limit`` bytes; else
    :class:`FileRefused`. Never blocks on a FIFO or a device and never reads more
    than ``limit + 1`` bytes, whatever replaces the file meanwhile.

    ``pipes``: a pipe or FIFO is read too, up to the bound, for a command's own
    arguments (``--token-file <(...)``), never for a file the config names: it waits
    for its writer to finish (and a FIFO no one has open for writing reads as empty)."""
    check_file(path, limit, pipes=pipes)  # a FIFO or device is never even opened
    try:
        # Replaced by a FIFO since the stat: O_NONBLOCK opens it at once (then fstat
        # refuses it), and O_NOCTTY keeps a terminal from becoming ours.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise FileRefused(path, f"cannot read: {_why(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        _check(path, os.fstat(fd), limit, pipes)
        os.set_blocking(fd, True)  # a pipe's writer may not have written yet
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise FileRefused(path, f"cannot read: {_why(exc)}") from None
    if len(data) > limit:  # it grew since the fstat, or says a size it does not hold
        raise FileRefused(path, f"larger than {size_text(limit)}", too_large=True)
    return data


def read_text(path: Path, limit: int, *, pipes: bool = False) -> str:
    """:func:`read_file`, as UTF-8 text; a file that is not is :class:`FileRefused`."""
    data = read_file(path, limit, pipes=pipes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"not UTF-8 text (byte {exc.start})") from None


def read_pem(path: Path, limit: int) -> str:
    """:func:`read_file`, as the ASCII text ssl takes PEM in. A byte past ASCII can only
    be in a comment between blocks (base64 has none), and is dropped: ssl refuses
    such a string whole."""
    return read_file(path, limit).decode("ascii", "ignore")
