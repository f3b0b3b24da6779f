"""A disk that fills up, for tests: writes under one directory get `free` bytes in all, then
fail with ENOSPC, as a full filesystem fails them.

A real full disk cannot be made in a test run in general: it takes mounting a small
filesystem (root, or a user namespace that CI runners and containers often refuse), and a test
must never fill the machine's own disk. So the lowest-level write is patched instead: the file
objects that `open()`, `io.open()` (pathlib) and `os.fdopen()` return for a path under the
directory (the atomic writers, the blob store, the upload staging, the download of a partial
file). A write that does not fit writes what still fits, then raises OSError(ENOSPC), leaving
the partly written file a real full disk leaves, for the code under test to clean up. (One
client test also runs a pull on a real, tiny tmpfs where a user namespace allows mounting one:
tests/zoo/test_client_cli.py.)

    with full_disk(monkeypatch, cache_root, free=0) as disk:
        ...                     # disk.refused: the writes that failed
    # leaving the block frees the disk again
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class FullDisk:
    def __init__(self, root: Path, free: int, code: int):
        self.root = os.path.realpath(root)
        self.free = free
        self.code = code
        self.refused = 0
        self._lock = threading.Lock()     # the registry serves uploads from worker threads

    def holds(self, path: str) -> bool:
        path = os.path.realpath(path)
        return path == self.root or path.startswith(self.root + os.sep)

    def take(self, n: int) -> int:
        """How many of n bytes still fit; they are taken."""
        with self._lock:
            fits = min(n, self.free)
            self.free -= fits
            if fits < n:
                self.refused += 1
            return fits


class _FillingFile:
    """A file object whose writes stop with ENOSPC once its disk is full."""

    def __init__(self, f, disk: FullDisk):
        self._f = f
        self._disk = disk

    def write(self, data):
        fits = self._disk.take(len(data))
        if fits < len(data):
            self._f.write(data[:fits])
            raise OSError(self._disk.code, os.strerror(self._disk.code))
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _writes(mode: str) -> bool:
    return any(c in mode for c in "wax+")


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@contextmanager
def full_disk(monkeypatch, root: str | Path, free: int = 0,
              code: int = errno.ENOSPC) -> Iterator[FullDisk]:
    """Writes under `root` fail once `free` bytes are written (code: ENOSPC, or EDQUOT for a
    quota); undone when the block ends."""
    disk = FullDisk(Path(root), free, code)
    real_open = builtins.open

    def filling_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if not _writes(mode):
            return f
        path = _fd_path(file) if isinstance(file, int) else os.fspath(file)
        return _FillingFile(f, disk) if disk.holds(path) else f

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", filling_open)
        # pathlib opens through io.open, and os.fdopen (the atomic writers' and the blob store's
        # temp files, from tempfile.mkstemp) too: an fd is followed to its path
        m.setattr(io, "open", filling_open)
        yield disk


def unshare_or_skip(where: str | Path) -> str:
    """The `unshare` binary, where it can mount a tmpfs (at `where`) in a user namespace of its
    own: `unshare -rm sh -c 'mount -t tmpfs -o size=64k tmpfs DIR; ...'` then gives a real full
    disk to a child process. Else the calling test is skipped (the kernel or the container
    refuses user namespaces)."""
    import pytest

    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run([unshare, "-rm", "sh", "-c", "mount -t tmpfs -o size=64k "
                                        f"tmpfs {where}"], capture_output=True, timeout=30)
    if not probe or probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs in a user namespace here: "
                    + (probe.stderr.decode().strip() if probe else "no unshare"))
    return unshare


def run_on_a_tiny_tmpfs(disk: Path, command: str, env: dict, timeout: float = 120):
    """`command` (a shell line) in a user namespace of its own, with a 64 KB tmpfs mounted at
    `disk` (made here): a real full disk. Skips the calling test where that cannot be done."""
    unshare = unshare_or_skip(disk.parent)
    disk.mkdir()
    return subprocess.run([unshare, "-rm", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs '
                           f'"{disk}" || exit 99; {command}'], capture_output=True, text=True,
                          env=env, timeout=timeout)
