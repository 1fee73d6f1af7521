"""Files no path in a config should name, made at a path the test gives: a device
(``/dev/zero``, which never ends), a FIFO (opening it blocks until a writer comes), a
directory, and a sparse file larger than any file the gateway reads (1 GiB that takes
no disk). Each is what backends/files.py refuses, with the words it says it in."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from backends.files import size_text

#: Past every bound of backends/files.py, in no blocks at all.
HUGE_BYTES = 1 << 30

KINDS = ("device", "fifo", "directory", "huge")


def make_hostile(kind: str, path: Path) -> Path:
    """``path``, made a file of ``kind`` (it must not exist yet); a device is a symbolic
    link to /dev/zero, so that it can stand at any path."""
    if kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(HUGE_BYTES)
    else:
        raise ValueError(kind)
    return path


def replace_with_hostile(kind: str, path: Path) -> Path:
    """The file at ``path`` replaced by one of ``kind`` (as a rotation would replace it)."""
    path.unlink()
    return make_hostile(kind, path)


def refusal(kind: str, limit: int) -> str:
    """What the reader says of a file of ``kind``, after its name, for a kind of file
    of at most ``limit`` bytes."""
    return {
        "device": "a character device, not a regular file",
        "fifo": "a FIFO, not a regular file",
        "directory": "a directory, not a regular file",
        "huge": f"larger than {size_text(limit)}",
    }[kind]


@functools.cache
def hostile_paths() -> tuple[str, ...]:
    """One file of each kind, made once per process in a directory of its own (removed
    at exit), by absolute path: for the config fuzz to put in any path field, read by
    check-config in this process or by a gateway process it starts."""
    where = Path(tempfile.mkdtemp(prefix="authn-gateway-hostile-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    made = [make_hostile(kind, where / kind) for kind in KINDS if kind != "device"]
    return ("/dev/zero", *(str(path) for path in made))
