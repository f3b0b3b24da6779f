"""Content-addressed blob store: `<data_dir>/blobs/sha256/<hash>`.

Writes are atomic (temp file in the same directory, fsync, rename) and verified while they
stream, so a blob exists only with the bytes its name promises. Reads are verified too: the
first read of a blob (and any read after its size, mtime or inode changed) hashes it; a clean
result is remembered for the life of the process, so serving stays fast.

Storing a blob that is already there keeps the stored copy only if it is sound: one this process
has verified (and that has not changed since) is trusted as it is; any other copy is hashed once,
and one that no longer hashes to its name (bit rot) is replaced by the verified new bytes. So
storing the good bytes again (a re-publish, a re-upload) repairs what StorageCorrupt reports.
Hashing costs one read of the stored copy, about what reading the incoming bytes costs and less
than writing them, and only once per process; rewriting every stored-again blob would cost a
full write and fsync each time, and would make every process hash it afresh on its next read.

Garbage collection spares young blobs, and storing a blob again touches it, so a publish not
yet committed keeps its blobs. The check-and-touch of a store, the creation and rename of its
temp file, and the age-check-and-unlink of a collection each run under the flock of
`blobs/.lock` (shared for stores, exclusive per deletion), so neither a touch nor a rename can
land between a collection's age check and its unlink, in any process on this host. A writer
also holds a flock on its own temp file until it is renamed: collections remove temp files left
by a crashed write once they are old, and never one whose writer is alive, however slow. flock
locks die with their process, so a crash leaves none behind.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import secrets
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from ..zoo.errors import IntegrityError, StorageCorrupt
from ..zoo.files import (copy_checked, fsync_dir, is_sha256, out_of_space, sha256_bytes,
                         sha256_file)

log = logging.getLogger("oscar_zoo.blobs")

# What a full registry disk answers (StorageFull, HTTP 507), after what was being written.
FREE_SPACE = ("no version was recorded and nothing half-written is kept. To fix: the registry's "
              "operator frees space in its data dir (OSCAR_ZOO_DATA_DIR), where `oscar-zoo db gc` "
              "removes the blobs no version references and uploads that died; then send it again")

# `.<sha256>.<random>.tmp`: the names _write gives its temp files (and zoo.files gave them before).
_TEMP_NAME = re.compile(r"^\.[0-9a-f]{64}\.[^/]+\.tmp$")

_Stamp = tuple[int, int, int]


def _stamp(st: os.stat_result) -> _Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class BlobStore:
    def __init__(self, root: str | Path):
        self.root = Path(root) / "blobs" / "sha256"
        self.root.mkdir(parents=True, exist_ok=True)
        self._verified: dict[str, _Stamp] = {}
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
        if not self._keep_if_sound(sha256, size):
            with open(src, "rb") as f:
                self._write(f, sha256, size)
        return dest

    def put_stream(self, src: BinaryIO, sha256: str, size: int | None = None) -> Path:
        dest = self.path(sha256)
        if not self._keep_if_sound(sha256, size):
            self._write(src, sha256, size)
        return dest

    def put_bytes(self, data: bytes) -> str:
        sha = sha256_bytes(data)
        if not self._keep_if_sound(sha, len(data)):
            self._write(io.BytesIO(data), sha, len(data))
        return sha

    def _keep_if_sound(self, sha256: str, size: int | None = None) -> bool:
        """True when blob `sha256` is stored with the bytes its name promises; it is then touched.

        False when it is missing or unsound, so the caller writes its verified bytes over it.
        """
        p = self.path(sha256)
        try:
            st = p.stat()
        except FileNotFoundError:
            return False
        if size is not None and st.st_size != size:
            return False
        if not self._known_sound(sha256, st):
            # Hashed outside the lock: a collection must not wait for a large blob's read. The
            # stamp check below notices a blob replaced or removed meanwhile.
            actual = sha256_file(p)
            if actual != sha256:
                log.warning("stored blob %s... hashes to %s...; replacing it with the verified "
                            "copy being stored", sha256[:12], actual[:12])
                return False
        # A blob stored again may belong to a publish that has not committed yet: make it young,
        # so collect_garbage (which spares young blobs) does not remove an old unreferenced copy.
        # A blob written anew is young already; the lock only has to cover check and touch.
        with self._flock(fcntl.LOCK_SH):
            try:
                if _stamp(p.stat()) != _stamp(st):
                    return False
                os.utime(p)
                self._remember(sha256, p.stat())
            except FileNotFoundError:
                return False        # a collection removed it meanwhile
            return True

    def _write(self, src: BinaryIO, sha256: str, size: int | None) -> None:
        """Stream src into a temp file beside the blob while hashing it, and rename it over
        whatever is stored under that name only when size and hash match; else leave nothing.
        Raises IntegrityError, StorageFull (the disk is full; the temp file is gone too)."""
        # no path in the message: the API answers with it, and clients need not know the
        # server's data dir (the server's log gets it from StorageFull.path)
        doing = f"storing a bundle file (sha256:{sha256[:12]}...)"
        with out_of_space("the registry's blob store", doing, FREE_SPACE, self.root):
            self._write_temp_then_rename(src, sha256, size)

    def _write_temp_then_rename(self, src: BinaryIO, sha256: str, size: int | None) -> None:
        fd, tmp = self._create_temp(sha256)
        try:
            # Closing the file releases its flock: the rename happens before, inside the `with`.
            with os.fdopen(fd, "wb") as f:
                copy_checked(src, f, sha256, size, sha256)
                f.flush()
                os.fsync(f.fileno())
                with self._flock(fcntl.LOCK_SH):
                    os.replace(tmp, self.path(sha256))
        except BaseException:
            _unlink_missing_ok(tmp)
            raise
        fsync_dir(self.root)

    def _create_temp(self, sha256: str) -> tuple[int, Path]:
        """A new temp file for blob `sha256`, open and flocked by this writer until it closes.

        Created under the store's shared lock, so a collection (which looks at temp files under
        the exclusive one) never finds it between its creation and its flock.
        """
        with self._flock(fcntl.LOCK_SH):
            while True:
                tmp = self.root / f".{sha256}.{secrets.token_hex(4)}.tmp"
                try:
                    # 0o666 less the umask: the mode a plain open() gives, as the final blob needs.
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                except FileExistsError:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else knows the name yet: never waits
                return fd, tmp

    def _known_sound(self, sha256: str, st: os.stat_result) -> bool:
        with self._lock:
            return self._verified.get(sha256) == _stamp(st)

    def _remember(self, sha256: str, st: os.stat_result) -> None:
        with self._lock:
            self._verified[sha256] = _stamp(st)

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

    def verified_path(self, sha256: str, of: str | None = None) -> Path:
        """The blob's path after checking its bytes still hash to its name. `of`: what refers
        to it (`file 'x' of model version 3`), for the message of a blob that is missing.

        Raises StorageCorrupt when they do not (the blob is not deleted: an operator looks at it;
        storing the good bytes again replaces it) or when the blob is missing: every caller asks
        for a blob a row references.
        """
        p = self.path(sha256)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise missing_blob(sha256, of) from None
        if self._known_sound(sha256, st):
            return p
        actual = sha256_file(p)
        if actual != sha256:
            raise StorageCorrupt(f"stored blob {sha256[:12]}... hashes to {actual[:12]}...; the "
                                 "registry's disk is corrupt; restore the blob from a mirror")
        self._remember(sha256, st)
        return p

    def read_range(self, sha256: str, start: int, end: int) -> bytes:
        with open(self.verified_path(sha256), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def all(self) -> Iterable[str]:
        return (p.name for p in self.root.iterdir() if is_sha256(p.name))

    def collect_garbage(self, referenced: set[str], min_age_s: float = 3600) -> list[str]:
        """Remove blobs no row references, older than min_age_s (younger ones may belong to a
        publish whose transaction has not committed yet). Returns the removed hashes.

        Also removes the temp files of writes that died (a crash, a kill) once they are older than
        min_age_s; a live writer's temp file is never removed, whatever its age.
        """
        removed = [sha for sha in list(self.all())
                   if sha not in referenced and self._remove_if_old(self.path(sha), min_age_s)]
        for p in list(self.root.iterdir()):
            if _TEMP_NAME.match(p.name):
                self._remove_if_abandoned(p, min_age_s)
        return removed

    def _remove_if_old(self, p: Path, min_age_s: float) -> bool:
        with self._flock(fcntl.LOCK_EX):
            try:
                if time.time() - p.stat().st_mtime <= min_age_s:
                    return False
                os.unlink(p)
            except FileNotFoundError:
                return False        # another collection removed it first
            return True

    def _remove_if_abandoned(self, tmp: Path, min_age_s: float) -> bool:
        # Under the exclusive lock no writer creates or renames a temp file, so the name still
        # means the file opened here when it is unlinked.
        with self._flock(fcntl.LOCK_EX):
            try:
                fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False        # renamed into place, or removed by another collection
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False    # its writer is alive and still writing
                # The age still counts: a writer of an older release holds no flock on its file.
                if time.time() - os.fstat(fd).st_mtime <= min_age_s:
                    return False
                _unlink_missing_ok(tmp)
                log.info("removed %s, left by a blob write that did not finish", tmp.name)
                return True
            finally:
                os.close(fd)


# No server path: the API answers with this (the operator knows where OSCAR_ZOO_DATA_DIR is).
RESTORE = ("the registry's operator must publish the bundle it belongs to again (storing the "
           "bundle's files puts the blob back; the version keeps its number) or restore the blob "
           "store (blobs/ in OSCAR_ZOO_DATA_DIR) from a backup")


def missing_blob(sha256: str, of: str | None = None) -> StorageCorrupt:
    """A blob that a row references and the store lacks (a lost disk, a manual delete)."""
    what = f"the registry's blob of {of}" if of else "stored blob"
    return StorageCorrupt(f"{what} (sha256:{sha256[:12]}...) is missing from the registry's "
                          f"store; {RESTORE}")


def _unlink_missing_ok(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
