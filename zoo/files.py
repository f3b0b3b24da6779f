"""File-system primitives shared by the bundle writer, the client cache and the blob store.

Everything that lands on disk goes through here: write to a temp name in the same directory,
fsync, rename. A crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import IntegrityError, UnsafePathError

CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: str) -> bool:
    return bool(_SHA256.match(value or ""))


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _public_mode(Path(tmp))
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        _unlink(tmp)
        raise


def copy_verified(src: BinaryIO, dest: str | Path, sha256: str | None, size: int | None = None) -> str:
    """Stream src into dest atomically while hashing; refuse (and leave nothing) on mismatch."""
    h, n = hashlib.sha256(), 0
    with atomic_writer(dest) as f:
        for block in iter(lambda: src.read(CHUNK), b""):
            h.update(block)
            n += len(block)
            f.write(block)
        digest = h.hexdigest()
        if size is not None and n != size:
            raise IntegrityError(f"{Path(dest).name}: got {n} bytes, expected {size}")
        if sha256 is not None and digest != sha256:
            raise IntegrityError(f"{Path(dest).name}: sha256 {digest[:12]}... does not match "
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
    """Rename a fully written staging dir to its final name (atomic for a new name)."""
    final = Path(final)
    _public_mode(tmp, directory=True)
    for p in tmp.rglob("*"):
        # a hard link's mode is its inode's: a cache blob that other snapshots share stays read-only
        if p.is_dir() or p.stat().st_nlink == 1:
            _public_mode(p, directory=p.is_dir())
    if final.exists():
        if not overwrite:
            raise FileExistsError(f"{final} already exists; pass overwrite=True or choose another path")
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
