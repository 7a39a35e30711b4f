"""One writer per run directory: a lock file that names its holder and frees itself when the holder dies.

`<run dir>/.lock` holds the PID and host of the run writing the directory, and that run keeps an exclusive `flock` on
it. The operating system drops the flock when the process ends, however it ends (kill -9 included), so a lock whose
flock can be taken is stale and is taken over; one that cannot is held by a live run, which the error names.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from .config import ConfigError

__all__ = ["RunLock", "RunLockedError", "LOCK_FILE", "writable_run_dir"]

LOCK_FILE = ".lock"


class RunLockedError(ValueError):
    """Another live run writes this run directory."""


def writable_run_dir(run_dir: Path) -> bool:
    """Create `run_dir` (and parents) if needed; True if this call created it. A path that is a file, or a folder
    that cannot be written, is a ConfigError naming the key to change."""
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigError(
                f"{parent} is a file, not a folder; set train.output_dir (or train.run_name) to a folder path"
            )
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise ConfigError(
            f"cannot write to {e.filename or run_dir} ({e.strerror}); set train.output_dir to a folder you can write"
        ) from None
    return created


class RunLock:
    """`with RunLock(run_dir): ...`, or acquire() / release(). Re-entrant per object, not per process."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:  # never through a link: a planted `.lock -> ~/file` would have that file truncated
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            raise ConfigError(self._not_a_file()) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(self._not_a_file())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(self._held_message()) from None
        holder = dict(pid=os.getpid(), host=socket.gethostname(), since=time.strftime("%Y-%m-%d %H:%M:%S"))
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode())
        self._fd = fd

    def _not_a_file(self) -> str:
        what = "a symbolic link" if self.path.is_symlink() else "not a plain file"
        return f"{self.path} is {what}; a run's lock is a plain file: remove it (and check who put it there)"

    def _held_message(self) -> str:
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        return (
            f"{self.path.parent} is being written by another run ({who}, since {holder.get('since', '?')}); wait "
            f"for it to finish or stop it, or start this one with train.run_name=<new name>"
        )

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
