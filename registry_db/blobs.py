"""Content-addressed blob store: `<data_dir>/blobs/sha256/<hash>`.

Writes are atomic (temp file in the same directory, fsync, rename) and verified while they
stream, so a blob exists only with the bytes its name promises. Reads are verified too: the
first read of a blob (and any read after its size, mtime or inode changed) hashes it; a clean
result is remembered for the life of the process, so serving stays fast.

Garbage collection spares young blobs, and storing a blob again touches it, so a publish not
yet committed keeps its blobs. The check-and-touch of a store and the age-check-and-unlink of
a collection each run under the flock of `blobs/.lock` (shared for stores, exclusive per
deletion), so a touch can never land between a collection's age check and its unlink, in any
process on this host; flock locks die with their process, so a crash leaves none behind.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from ..zoo.errors import IntegrityError, StorageCorrupt
from ..zoo.files import atomic_write_bytes, copy_verified, is_sha256, sha256_bytes, sha256_file


class BlobStore:
    def __init__(self, root: str | Path):
        self.root = Path(root) / "blobs" / "sha256"
        self.root.mkdir(parents=True, exist_ok=True)
        self._verified: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def path(self, sha256: str) -> Path:
        if not is_sha256(sha256):
            raise IntegrityError(f"{sha256!r} is not a sha256 hex digest")
        return self.root / sha256

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put_file(self, src: str | Path, sha256: str, size: int | None = None) -> Path:
        """Copy src in as blob `sha256`; raises IntegrityError (and stores nothing) on mismatch."""
        dest = self.path(sha256)
        if not self._touch_if_stored(dest, size):
            with open(src, "rb") as f:
                copy_verified(f, dest, sha256, size)
        return dest

    def put_stream(self, src: BinaryIO, sha256: str, size: int | None = None) -> Path:
        dest = self.path(sha256)
        if not self._touch_if_stored(dest):
            copy_verified(src, dest, sha256, size)
        return dest

    def put_bytes(self, data: bytes) -> str:
        sha = sha256_bytes(data)
        if not self._touch_if_stored(self.path(sha)):
            atomic_write_bytes(self.path(sha), data)
        return sha

    def _touch_if_stored(self, dest: Path, size: int | None = None) -> bool:
        # A blob stored again may belong to a publish that has not committed yet: make it young,
        # so collect_garbage (which spares young blobs) does not remove an old unreferenced copy.
        # A blob written anew is young already; the lock only has to cover check and touch.
        with self._flock(fcntl.LOCK_SH):
            if not dest.is_file() or (size is not None and dest.stat().st_size != size):
                return False
            os.utime(dest)
            return True

    @contextmanager
    def _flock(self, how: int) -> Iterator[None]:
        # One open file description per holder: flock then also orders threads of one process.
        # Beside sha256/, not in it: listings of the blobs see blobs only.
        fd = os.open(self.root.parent / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    def verified_path(self, sha256: str) -> Path:
        """The blob's path after checking its bytes still hash to its name.

        Raises StorageCorrupt when they do not (the blob is not deleted: an operator looks at it)
        or when the blob is missing: every caller asks for a blob a row references.
        """
        p = self.path(sha256)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise StorageCorrupt(f"stored blob {sha256[:12]}... is missing from the registry's "
                                 "store; restore it from a mirror") from None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            if self._verified.get(sha256) == stamp:
                return p
        actual = sha256_file(p)
        if actual != sha256:
            raise StorageCorrupt(f"stored blob {sha256[:12]}... hashes to {actual[:12]}...; the "
                                 "registry's disk is corrupt; restore the blob from a mirror")
        with self._lock:
            self._verified[sha256] = stamp
        return p

    def read_range(self, sha256: str, start: int, end: int) -> bytes:
        with open(self.verified_path(sha256), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def all(self) -> Iterable[str]:
        return (p.name for p in self.root.iterdir() if is_sha256(p.name))

    def collect_garbage(self, referenced: set[str], min_age_s: float = 3600) -> list[str]:
        """Remove blobs no row references, older than min_age_s (younger ones may belong to a
        publish whose transaction has not committed yet). Returns the removed hashes."""
        return [sha for sha in list(self.all())
                if sha not in referenced and self._remove_if_old(self.path(sha), min_age_s)]

    def _remove_if_old(self, p: Path, min_age_s: float) -> bool:
        with self._flock(fcntl.LOCK_EX):
            try:
                if time.time() - p.stat().st_mtime <= min_age_s:
                    return False
                os.unlink(p)
            except FileNotFoundError:
                return False        # another collection removed it first
            return True
