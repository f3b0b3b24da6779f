"""File-system primitives shared by the bundle writer, the client cache and the blob store.

Everything that lands on disk goes through here: write to a temp name in the same directory,
fsync, rename. A crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import IntegrityError, StorageFull, UnsafePathError, is_no_space

CHUNK = 1 << 20
PARTIAL = "partial.json"   # beside a --layers output's files: its layers and their tensors' sha256
CACHED_PART = ".partial.json"   # in a cached --layers part: its layers and its files' sha256
_SHA256 = re.compile(r"[0-9a-f]{64}")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: str) -> bool:
    return bool(_SHA256.fullmatch(value or ""))


def safe_join(root: str | Path, name: str) -> Path:
    """root/name, refusing names that are absolute, contain '..', or resolve outside root."""
    if not name or name.startswith(("/", "\\")) or "\x00" in name:
        raise UnsafePathError(f"file name {name!r} is not a plain relative path")
    parts = re.split(r"[\\/]", name)
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"file name {name!r} may not contain empty, '.' or '..' parts")
    root = Path(root).resolve()
    target = (root / name).resolve()
    if target != root and root not in target.parents:
        raise UnsafePathError(f"file name {name!r} escapes its directory")
    return target


@contextmanager
def out_of_space(where: str, doing: str, then: str,
                 path: str | Path | None = None) -> Iterator[None]:
    """Raise a full disk met inside as one actionable StorageFull: "out of disk space in
    {where} ({the OS's reason}) while {doing}; {then}". `then` says what was kept and how to make
    room. A StorageFull from deeper down names its own place and passes as it is."""
    try:
        yield
    except OSError as e:
        if not is_no_space(e):
            raise
        reason = e.strerror or os.strerror(e.errno)
        raise StorageFull(f"out of disk space in {where} ({reason}) while {doing}; {then}",
                          e.errno, str(path) if path is not None else None) from e


OUT_FULL = "nothing half-written was kept. To fix: free space on that disk, or choose another --out"


def out_dir_out_of_space(out: str | Path, doing: str):
    """out_of_space for a command's --out DIR: the error names the option and its directory,
    and the fix is there, not in the cache (`oscar-zoo prune` frees nothing on that disk)."""
    return out_of_space(f"--out {out}", doing, OUT_FULL, out)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _public_mode(path: Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp create 0600/0700; give the final file the mode a plain open() would."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def fsync_dir(path: str | Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """Open a temp file beside `path`; on clean exit fsync and rename it into place."""
    with atomic_writers([Path(path)]) as (f,):
        yield f


@contextmanager
def atomic_writers(paths: list[Path]) -> Iterator[list[BinaryIO]]:
    """atomic_writer for files that belong together (an engine's K and V): every temp file is
    written and fsynced before the first rename, so a failure or Ctrl-C while writing leaves
    all of `paths` as they were; only a crash within the renames themselves can mix them."""
    temps: list[tuple[Path, Path]] = []
    try:
        with ExitStack() as files:
            outs = []
            for path in map(Path, paths):
                if path.is_dir():   # found now, not at its rename after the others moved
                    raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(path))
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                temps.append((Path(tmp), path))
                outs.append(files.enter_context(os.fdopen(fd, "wb")))
            yield outs
            for f in outs:
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in temps:
            _public_mode(tmp)
            os.replace(tmp, path)
        for parent in {path.parent for _, path in temps}:
            fsync_dir(parent)
    except BaseException:
        for tmp, _ in temps:
            _unlink(tmp)
        raise


def copy_verified(src: BinaryIO, dest: str | Path, sha256: str | None, size: int | None = None) -> str:
    """Stream src into dest atomically while hashing; refuse (and leave nothing) on mismatch."""
    with atomic_writer(dest) as f:
        return copy_checked(src, f, sha256, size, Path(dest).name)


def copy_checked(src: BinaryIO, dest: BinaryIO, sha256: str | None, size: int | None,
                 name: str) -> str:
    """Stream src into the open file dest while hashing; raises IntegrityError (naming `name`)
    when size or sha256 differ from the expected ones. Returns the sha256."""
    h, n = hashlib.sha256(), 0
    for block in iter(lambda: src.read(CHUNK), b""):
        h.update(block)
        n += len(block)
        dest.write(block)
    digest = h.hexdigest()
    if size is not None and n != size:
        raise IntegrityError(f"{name}: got {n} bytes, expected {size}")
    if sha256 is not None and digest != sha256:
        raise IntegrityError(f"{name}: sha256 {digest[:12]}... does not match "
                             f"expected {sha256[:12]}...; the source is corrupt, fetch it again")
    return digest


@contextmanager
def staging_dir(final: str | Path) -> Iterator[Path]:
    """A temp dir beside `final`, removed unless the caller renames it into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, final: Path, overwrite: bool = False) -> None:
    """Rename a fully written staging dir to its final name.

    Atomic for a new name; over an existing `final` (overwrite=True) the two trees are swapped
    in one step (renameat2 RENAME_EXCHANGE), so a reader always finds `final`, old or new.
    """
    final = Path(final)
    _public_mode(tmp, directory=True)
    for p in tmp.rglob("*"):
        # a hard link's mode is its inode's: a cache blob that other snapshots share stays read-only
        if p.is_dir() or p.stat().st_nlink == 1:
            _public_mode(p, directory=p.is_dir())
    heal_dir(final)
    if final.exists():
        if not overwrite:
            raise FileExistsError(f"{final} already exists; pass overwrite=True or choose another path")
        _replace_dir(Path(tmp), final)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def heal_dir(final: str | Path) -> None:
    """Undo what an interrupted two-rename publish left (see _replace_dir's fallback).

    `final` missing beside `.final.old` means a publish stopped between its two renames: the old
    tree is the last complete publish and the new one never arrived, so the old tree goes back
    (as if that publish had not started; deleting it would lose the only copy, and an
    overwrite=False caller must still see `final` exist). With `final` present, `.old` is a
    leftover of a publish that finished and is removed.
    """
    final = Path(final)
    old = _old_name(final)
    if not old.exists():
        return
    if os.path.lexists(final):
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(old, final)
    except FileNotFoundError:
        pass                        # another process healed it first
    except OSError:
        if final.exists():          # a publish finished meanwhile: its tree wins
            shutil.rmtree(old, ignore_errors=True)


def _old_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def _replace_dir(tmp: Path, final: Path) -> None:
    try:
        _exchange(tmp, final)
    except OSError as e:
        if e.errno not in _NO_EXCHANGE:
            raise
        _replace_dir_in_two_renames(tmp, final)
    else:
        shutil.rmtree(tmp, ignore_errors=True)    # the old tree, swapped out to the staging name


def _replace_dir_in_two_renames(tmp: Path, final: Path) -> None:
    # Not atomic: between the renames `final` is missing. A crash there leaves the old tree at
    # `.final.old`, which heal_dir (the next publish, or a reader) puts back.
    old = _old_name(final)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        heal_dir(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


# errnos meaning "this kernel, libc or filesystem cannot exchange" (EPERM: a seccomp filter
# that refuses the syscall): fall back to two renames, which fail cleanly on a real EPERM
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}
_RENAME_EXCHANGE = 1 << 1   # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two existing paths (Linux renameat2; Python has no binding for it)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(a))
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


@functools.lru_cache(maxsize=1)
def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2    # glibc >= 2.28, musl >= 1.2.4
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
