"""Where the commands write their results (`--out`, `--json`, `--csv`): each destination is checked before any work,
and written atomically (a temporary file in the same folder, then a rename), so that a bad path fails in one line
before a long measurement and a full disk never leaves a truncated file."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from .checkpoint import atomic_write_text

__all__ = ["DestinationError", "check_destination", "writing", "write_text"]

MIN_FREE_BYTES = 1 << 20  # a folder on a disk with less free space than this is refused before any work


class DestinationError(ValueError):
    """A result destination that cannot be written (one line naming the flag, the path and the fix)."""


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_destination(path: str | os.PathLike, flag: str, folder: bool = False, create: bool = True) -> Path:
    """Raise a DestinationError unless `path` (a file; a folder with `folder=True`) can be written: its folder
    exists (or, with `create`, can be made below a writable folder), is a folder, is writable and its disk is not
    full. Nothing is created."""
    path = Path(path).expanduser().absolute()
    where = f"{flag} {path}".lstrip()
    if folder and path.exists() and not path.is_dir():
        raise DestinationError(f"{where} is a file, not a folder; choose a folder path")
    if not folder and path.is_dir():
        raise DestinationError(f"{where} is a folder; give a file name")
    parent = path if folder else path.parent
    existing = _nearest_existing(parent)
    if existing != parent and not create:
        raise DestinationError(f"{where}: folder {parent} does not exist; create it first or choose another path")
    if not existing.is_dir():
        raise DestinationError(f"{where}: {existing} is a file, not a folder; choose another path")
    probe = existing / f".write-test-{os.getpid()}"
    try:  # os.access says yes to root on a chmod 555 folder; a real file says what a write would meet
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise DestinationError(f"{where}: cannot write to {existing} ({e.strerror}); choose another path") from None
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        free = MIN_FREE_BYTES
    if free < MIN_FREE_BYTES:
        raise DestinationError(f"{where}: the disk holding {existing} is full ({free} bytes free); free space first")
    return path


@contextlib.contextmanager
def writing(path: str | os.PathLike, flag: str = "") -> Iterator[None]:
    """Around an atomic write of `path`: its folder is made, and a failed write (a full disk, a folder made
    read-only since the check) is one DestinationError line; the previous file, if any, is left as it was."""
    path, where = Path(path), f"{flag} {path}".lstrip()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DestinationError(f"{where}: disk full ({e.strerror}); free space and rerun") from None
        raise DestinationError(f"{where}: cannot write ({e.strerror or e}); choose another path") from None


def write_text(path: str | os.PathLike, text: str, flag: str = "") -> Path:
    """Write `text` to `path` atomically, a failure in one line (see `writing`)."""
    with writing(path, flag):
        atomic_write_text(path, text)
    return Path(path)
