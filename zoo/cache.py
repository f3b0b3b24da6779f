"""The client cache: content-addressed blobs, per-model refs and snapshots, cached exports.

    <cache>/                                (OSCAR_ZOO_CACHE, default $XDG_CACHE_HOME/oscar-zoo)
      CACHEDIR.TAG
      blobs/sha256/<sha256>                 verified file contents, read-only, deduplicated
      blobs/sha256/<sha256>.incomplete      a download in progress (resumed with Range)
      models/<name>/refs/<ref>              text: the bundle digest a ref pointed at when pulled
                                            (recommended, latest, v3, rotationzoo-hf, ...)
      models/<name>/snapshots/<digest>/     bundle.json, rotations.safetensors, README.md:
                                            hardlinks of the blobs (copies where the filesystem
                                            cannot link), so they are read-only too
      models/<name>/meta/<digest>.json      where it came from: source, version, origin, files
      models/<name>/imports/<key>           text: digest of the bundle converted from a given
                                            pair of RotationZoo .pt files (key hashes them);
                                            prune drops one whose bundle is no longer held
      models/<name>/partial/<digest>/layers-<spec>/   a --layers pull: bundle.json + a
                                            rotations.safetensors holding only those layers
      exports/<digest>/<format>[-layers-<spec>]/      engine files, built once per digest
      tmp/                                  a bundle being converted; a directory that prune or
                                            cache rm renamed here to delete it
      rescued/calibrate-<time>-<random>/<name>/   a bundle `oscar-zoo calibrate` could not write
                                            to its full --out; kept until its user moves it or
                                            removes it (`cache rm --rescued`, which removes
                                            rescued/ too once empty; prune and a cache rm of
                                            models leave it alone); `cache ls` lists it
      .locks/<key>.lock                     flock locks (soft locks with owner records where
                                            the filesystem has no flock)
      .locks/gc.lock                        shared by pulls, exports, verify's hashing and a
                                            calibrate saving a bundle in rescued/, exclusive
                                            for prune, cache rm and verify's repair
      .locks/gc-gate.lock                   passed by pulls on their way in, closed by prune,
                                            cache rm and verify's repair

A snapshot directory appears only by rename after every file in it is verified, so its existence
means "complete". Refs are written atomically after their snapshot exists. Two processes pulling
the same bundle serialize on a per-blob / per-snapshot lock, and the second finds the work done.
A pull holds gc.lock shared from its first request to its last export file, prune holds it
exclusive: prune never sees a pull's blobs or snapshot before the ref that keeps them, nor removes
a snapshot an export is about to read. `cache rm` (cache_remove.py) and verify's repair hold it
exclusive too, and remove a directory by renaming it into tmp/ first (cache rm drops a bundle's
refs before its snapshot, and so does verify's repair of a bundle it removes whole): no pull
finds half a snapshot, nor a ref to one that is gone, and a crash leaves what prune cleans up.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import settings
from .errors import BundleFormatError, LockTimeout, UnsafePathError
from .files import (CACHED_PART, atomic_write_bytes, fsync_dir, is_sha256, out_of_space,
                    publish_dir, safe_join, sha256_file, staging_dir)

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

# What a download leaves in blobs/ until its blob is adopted: our own partial file, a ModelScope
# workdir (download_file resumes from a file inside it), and that client's finished file.
_LEFTOVERS = (".incomplete", ".hub", ".hub.done")
_LEFTOVER_AGE = 3600

_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
        b"# This file is a cache directory tag created by oscar-zoo.\n")


def model_key(name: str) -> str:
    """Directory name for a model: hub ids keep their org, HF style (org--name)."""
    key = name.strip().lower().replace("/", "--")
    # ':' too: on Windows models/ joined with "d:" or "d:x" is a path on drive D, not in the cache
    if not key or key.startswith(".") or any(c in key for c in "\\:\x00") or ".." in key:
        raise UnsafePathError(f"model name {name!r} cannot be used as a cache directory")
    return key


@dataclass(frozen=True)
class Snapshot:
    model: str
    digest: str
    path: Path


@dataclass(frozen=True)
class Part:
    """A --layers pull: some layers of the bundle `digest`, at partial/<digest>/layers-<spec>/
    (layers None: a whole snapshot, as Cache.held lists it)."""

    model: str
    digest: str
    layers: str | None              # the spec, as export.layer_spec writes it: 3-7, 0-1_3
    path: Path


@dataclass(frozen=True)
class Rescued:
    """A directory `oscar-zoo calibrate` made under rescued/ when its --out was full: the bundle
    it saved there, or what a calibrate killed (or still writing) left. Two records of a dir
    nothing changed in between are equal: `cache rm --rescued` removes one only as its user
    confirmed it (cache_remove.remove_rescued)."""

    name: str                       # its directory under rescued/: calibrate-<time>-<random>
    path: Path                      # rescued/<name>/
    bundle: Path | None             # rescued/<name>/<bundle>/; None: no whole bundle in it
    saved: float                    # the dir's mtime: the bundle's rename into it
    touched: float                  # newest mtime in it: a write in progress keeps it fresh
    size: int | None                # bytes its files take (as _size counts); None: unreadable
    # (path under it, kind, size, mtime_ns) of everything in it; None: it cannot be read
    contents: tuple[tuple[str, str, int, int], ...] | None

    @property
    def kind(self) -> str:
        """saved (a whole bundle), incomplete (a calibrate killed or still writing: only its
        hidden staging dir), empty (its user moved the bundle out), or unreadable (another
        user's: mkdtemp makes it 0700)."""
        if self.contents is None:
            return "unreadable"
        if self.bundle is not None:
            return "saved"
        return "incomplete" if self.contents else "empty"


def absolute(path: str | Path) -> Path:
    """`path` made absolute, not resolved: links stay as the user named them (a `current` link
    swapped between releases keeps working in a saved recipe), as huggingface_hub's snapshot
    paths do. For every path oscar-zoo hands out: the cache root, exports, converted files."""
    return Path(os.path.abspath(path))


class Cache:
    def __init__(self, root: str | Path | None = None):
        # absolute: every path it hands out (pull --json, ls, export) is one a script can use
        # from any directory
        self.root = absolute(root if root is not None else settings.get("cache_dir"))

    # --- layout ------------------------------------------------------------------------------

    @property
    def blobs(self) -> Path:
        return self.root / "blobs" / "sha256"

    def blob(self, sha256: str) -> Path:
        return self.blobs / _sha(sha256)

    def incomplete(self, key: str) -> Path:
        return self.blobs / f"{key}.incomplete"

    def model_dir(self, name: str) -> Path:
        return self.root / "models" / model_key(name)

    def snapshot_dir(self, name: str, digest: str) -> Path:
        return self.model_dir(name) / "snapshots" / _sha(digest)

    def partial_dir(self, name: str, digest: str, spec: str) -> Path:
        return self.model_dir(name) / "partial" / _sha(digest) / f"layers-{spec}"

    def export_dir(self, digest: str, fmt: str, layer_spec: str | None = None) -> Path:
        return self.root / "exports" / _sha(digest) / (fmt if not layer_spec else f"{fmt}-layers-{layer_spec}")

    @property
    def rescued(self) -> Path:
        return self.root / "rescued"

    def out_of_space(self, doing: str):
        """A context in which a full disk (or quota) is one actionable StorageFull naming the
        cache. The cache's writers leave nothing half-written: temp files and staging dirs go
        with the failed write, and a download that hit the full disk drops its partial file."""
        return out_of_space(
            f"the oscar-zoo cache {self.root}", doing, "nothing half-written was kept. To fix: "
            "`oscar-zoo prune` removes what no ref uses and `oscar-zoo cache rm NAME` a whole "
            "model; or free space on that disk, or set OSCAR_ZOO_CACHE to a directory on a "
            "larger one", self.root)

    def ensure(self) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        tag = self.root / "CACHEDIR.TAG"
        if not tag.exists():
            atomic_write_bytes(tag, _TAG)

    # --- blobs -------------------------------------------------------------------------------

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        try:
            st = self.blob(sha256).stat()
        except FileNotFoundError:
            return False
        return size is None or st.st_size == size

    def adopt(self, path: Path, sha256: str) -> Path:
        """Move an already verified file into the blob store (read-only from then on)."""
        dest = self.blob(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o444)
        os.replace(path, dest)
        return dest

    def add_bytes(self, data: bytes, sha256: str) -> Path:
        dest = self.blob(sha256)
        if not dest.exists():
            atomic_write_bytes(dest, data)
            os.chmod(dest, 0o444)
        return dest

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self, name: str, digest: str) -> Snapshot | None:
        path = self.snapshot_dir(name, digest)
        return Snapshot(model_key(name), digest, path) if path.is_dir() else None

    def link_snapshot(self, name: str, digest: str, files: dict[str, str],
                      check: Callable[[Path], None] | None = None) -> Path:
        """Create snapshots/<digest>/ with one link per file into the blob store, atomically.

        `check` runs on the staged tree: a snapshot that exists has passed it, even if the
        process is killed the moment after."""
        final = self.snapshot_dir(name, digest)
        if final.is_dir():
            return final
        with staging_dir(final) as tmp:
            for fname, sha in files.items():
                link_file(self.blob(sha), safe_join(tmp, fname))
            if check is not None:
                check(tmp)
            publish_dir(tmp, final)
        seal(final)
        return final

    def snapshots(self, name: str | None = None) -> Iterator[Snapshot]:
        models = [self.model_dir(name)] if name else model_dirs(self)
        for mdir in models:
            for snap in sorted((mdir / "snapshots").glob("*")):
                if snap.is_dir() and is_sha256(snap.name):
                    yield Snapshot(mdir.name, snap.name, snap)

    def parts(self, name: str | None = None) -> Iterator[Part]:
        models = [self.model_dir(name)] if name else model_dirs(self)
        for mdir in models:
            for pdir in sorted((mdir / "partial").glob("*/layers-*")):
                if pdir.is_dir() and is_sha256(pdir.parent.name):
                    yield Part(mdir.name, pdir.parent.name, pdir.name.removeprefix("layers-"), pdir)

    def held(self, name: str | None = None) -> Iterator[Part]:
        """Everything cached: whole snapshots (layers None), then --layers parts."""
        for snap in self.snapshots(name):
            yield Part(snap.model, snap.digest, None, snap.path)
        yield from self.parts(name)

    def model_named(self, name: str) -> str:
        """The cache's name for a model as a user gave it: the model of that directory name,
        else the one whose cached bundles give it as their hub id (`org/repo` or `org--repo`,
        in any case, as hub ids are compared). A model only a registry knows is cached under
        the registry's name for it (tiny-model), though it was pulled by its hub id: offline,
        the same hub id must find it. Else the name as given: nothing is cached by it.

        For a name that is not the catalog's: a catalog model is cached under its catalog
        name, which its callers look up first (catalog.find)."""
        key = model_key(name)
        if (self.root / "models" / key).is_dir() or "--" not in key:   # no org: no hub id
            return name
        for mdir in model_dirs(self):
            hub_id = _hub_id_of(self, mdir.name)
            if hub_id is not None and _same_key(hub_id, key):
                return mdir.name
        return name

    def rescued_bundles(self, empty: bool = False) -> list[Rescued]:
        """What calibrate saved under rescued/, oldest first (its names start with the time).
        Not an empty dir (the user moved its bundle out, as calibrate's message says to) unless
        `empty`. Nor a link or a hidden entry: calibrate makes neither. A dir that cannot be
        read is listed (kind unreadable), not an error: another user's rescue must not stop a
        `cache ls`."""
        found = (_rescued(d) for d in _subdirs(self.rescued))
        return [r for r in found if r is not None and (empty or r.kind != "empty")]

    # --- refs, meta, import index ------------------------------------------------------------

    def write_ref(self, name: str, ref: str, digest: str) -> None:
        if self.read_ref(name, ref) != digest:  # a warm pull rewrites (and fsyncs) nothing
            atomic_write_bytes(self.model_dir(name) / "refs" / _ref_file(ref), (_sha(digest) + "\n").encode())

    def read_ref(self, name: str, ref: str) -> str | None:
        try:
            value = (self.model_dir(name) / "refs" / _ref_file(ref)).read_text(errors="replace").strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None     # a folder made by hand there is no ref, as Cache.refs lists
        return value if is_sha256(value) else None

    def refs(self, name: str) -> dict[str, str]:
        out = {}
        for p in sorted((self.model_dir(name) / "refs").glob("*")):
            # a dot file: the temp file of a write_ref that was killed; a folder (an HF-style
            # refs/pr/1 made by hand) holds no ref oscar-zoo could have written
            if p.name.startswith(".") or not p.is_file():
                continue
            value = p.read_text(errors="replace").strip()
            if is_sha256(value):
                out[p.name] = value
        return out

    def write_meta(self, name: str, digest: str, meta: dict) -> None:
        data = json.dumps(meta, indent=2, sort_keys=True).encode() + b"\n"
        atomic_write_bytes(self.model_dir(name) / "meta" / f"{_sha(digest)}.json", data)

    def read_meta(self, name: str, digest: str) -> dict:
        try:
            return json.loads((self.model_dir(name) / "meta" / f"{_sha(digest)}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def write_import(self, name: str, key: str, digest: str) -> None:
        atomic_write_bytes(self.model_dir(name) / "imports" / key, (digest + "\n").encode())

    def read_import(self, name: str, key: str) -> str | None:
        try:
            value = (self.model_dir(name) / "imports" / key).read_text().strip()
        except FileNotFoundError:
            return None
        return value if is_sha256(value) else None

    # --- locks -------------------------------------------------------------------------------

    @contextmanager
    def lock(self, key: str, what: str | None = None) -> Iterator[None]:
        """An exclusive lock shared by every process using this cache.

        flock locks vanish with their process, so a crashed pull never leaves a lock behind; on
        filesystems without flock, filelock falls back to soft lock files that record their
        owner's pid and host, and a lock whose owner is dead is broken (stale-lock recovery).
        Waiting is bounded by the lock_timeout setting; then LockTimeout names the holder.
        """
        from filelock import FileLock, Timeout

        path = self.root / ".locks" / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        timeout = float(settings.get("lock_timeout"))
        lock = FileLock(str(path), timeout=timeout)
        try:
            lock.acquire()
        except Timeout:
            raise LockTimeout(
                f"waited {timeout:g} s for {what or key}: another oscar-zoo process holds "
                f"{path} ({_owner(path)}). Wait for it to finish, or raise OSCAR_ZOO_LOCK_TIMEOUT"
            ) from None
        try:
            _write_owner(path)
            yield
        finally:
            lock.release()

    @contextmanager
    def gc_guard(self, exclusive: bool = False) -> Iterator[None]:
        """Shared by pulls (many at once), exclusive for prune: until its refs are written a
        pull's new blobs and snapshot look like garbage. Waiting is bounded by lock_timeout.

        A pull passes through a gate (gc-gate.lock) on its way in, and prune closes the gate
        before it waits: pulls that keep overlapping would otherwise hold the shared lock
        without a break and starve prune. Those already in finish; new ones wait for prune.

        A cache that does not exist has nothing to guard, and a lock file would create it
        (an offline pull or an export that finds nothing must leave no cache behind)."""
        if not self.root.exists():
            yield
            return
        gate = self._flock("gc-gate", True, "a prune is running")
        if gate is None:  # no flock here (Windows, some network filesystems): pulls serialize too
            with self.lock("gc-serial", "the cache (a pull or a prune)"):
                yield
            return
        try:
            fd = self._flock("gc", exclusive, "a pull is still running" if exclusive
                             else "a prune is running")
        except BaseException:
            os.close(gate)
            raise
        if not exclusive:   # a pull only passes through
            os.close(gate)
        try:
            yield
        finally:
            os.close(fd)
            if exclusive:
                os.close(gate)

    def _flock(self, name: str, exclusive: bool, holder: str) -> int | None:
        """An fd holding .locks/<name>.lock's flock, taken within lock_timeout (LockTimeout
        says `holder` is why not); None where the filesystem has no flock."""
        if fcntl is None:
            return None
        path = self.root / ".locks" / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        # one open file description per holder, so threads of one process exclude each other too
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if _flock_within(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, holder):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None


def _flock_within(fd: int, how: int, holder: str) -> bool:
    """Take the flock within lock_timeout; False where the filesystem has no flock."""
    timeout = float(settings.get("lock_timeout"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"waited {timeout:g} s for the cache: {holder}. Try again when "
                                  "it has finished, or raise OSCAR_ZOO_LOCK_TIMEOUT") from None
            time.sleep(0.05)
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
                return False
            raise


def _sha(digest: str) -> str:
    """A digest that is about to name a cache path (a blob, a snapshot, its meta)."""
    if not is_sha256(digest):
        raise BundleFormatError(f"not a sha256 digest: {str(digest)[:80]!r}")
    return digest


def _ref_file(ref: str) -> str:
    ref = ref.strip()
    if not ref or ref.startswith(".") or any(c in ref for c in "/\\:\x00"):
        raise UnsafePathError(f"ref {ref!r} cannot be used as a file name")
    return ref


def link_file(blob: Path, dest: Path) -> None:
    """dest -> blob: a hardlink (same inode, read-only like the blob), else a copy.

    Not a symlink: bundle verification resolves paths and refuses files that live outside the
    bundle directory, which is what a symlink into blobs/ would look like.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(blob, dest)
    except OSError:
        shutil.copyfile(blob, dest)


def seal(directory: Path) -> None:
    """Every file of a published snapshot read-only, as its blobs are: publish_dir leaves hard
    links alone but gives copies (where the cache cannot link) a plain open()'s mode."""
    for p in directory.iterdir():
        if p.is_file():
            os.chmod(p, 0o444)


def _write_owner(lock_path: Path) -> None:
    """Who holds the lock, for LockTimeout's message. Diagnostics only: a plain write, no
    fsync (a torn record just reads as "owner unknown")."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    try:
        lock_path.with_suffix(".owner").write_text(json.dumps(info))
    except OSError:
        pass


def _owner(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.with_suffix(".owner").read_text())
        age = time.time() - float(info["since"])
        return f"pid {info['pid']} on {info['host']}, for {age:.0f} s"
    except (OSError, ValueError, KeyError):
        return "owner unknown"


# --- verify and prune --------------------------------------------------------------------------

# Problem.model of an export built from a bundle directory, whose model the cache does not hold
DIR_EXPORT = "(bundle directory)"


@dataclass
class Problem:
    model: str
    digest: str
    file: str
    problem: str


def verify_cache(cache: Cache, model: str | None = None, repair: bool = True) -> tuple[int, list[Problem]]:
    """Re-hash every blob the snapshots (and --layers parts) of `model` (or all) point at, and
    the engine files exported from them.

    Returns (files checked, problems). With repair, a corrupt or missing blob is deleted along
    with every snapshot (or part) that uses it, so the next `pull` fetches it again, and so are
    the refs of a bundle left with nothing cached (no pull finds them naming a bundle that is
    gone); a corrupt export is deleted, so the next pull or export builds it again.

    Hashes under gc.lock shared, as pulls and exports hold it: a long verify must not stop them,
    and they only add, so nothing it hashes goes meanwhile (prune and cache rm wait). What looks
    wrong is checked again under the lock held exclusively, as prune holds it, before anything
    goes: a pull in progress has published its snapshot before its meta (its files read as "not
    recorded"), and a pull may have rebuilt an export or fetched a blob again since.
    """
    if not cache.root.exists():
        return 0, []
    with cache.gc_guard():
        checked, faults, scanned = _scan(cache, model)
    if not faults:
        return checked, []
    with cache.gc_guard(exclusive=True):
        hashes: dict[Path, str] = {}      # fresh: the first pass's hashes may be stale now
        faults = [f for f in (fault.again(hashes) for fault in faults) if f.problems]
        late, more = _late_links(cache, model, faults, scanned, hashes)
        if repair:
            _repair(cache, faults + more)
    return checked + late, [p for f in faults + more for p in f.problems]


@dataclass
class _Fault:
    """A snapshot, part or export directory found wrong: its problems, the corrupt blobs behind
    them (they go with it), and `again`, which checks the same files once more (given a memo of
    blob hashes) and returns what is still wrong."""

    path: Path
    problems: list[Problem]
    blobs: set[Path]
    again: Callable[[dict[Path, str]], "_Fault"]


def _scan(cache: Cache, model: str | None) -> tuple[int, list[_Fault], set[Path]]:
    """(files checked, the directories with problems in the order verify reports them, the
    snapshots and parts it looked at)."""
    checked, faults, hashes = 0, [], {}
    dirs = [(h.model, h.digest, h.path) for h in cache.held(model)]
    for name, digest, path in dirs:
        # each directory on its own: a part's bad blob spares the whole snapshot
        n, fault = _check_held(cache, name, digest, path, hashes)
        checked += n
        if fault.problems:
            faults.append(fault)
    names = {d: n for n, d, _ in reversed(dirs)}                       # first holder's name
    if model is None:   # exports of bundle directories (`export DIR`), digests no snapshot holds
        names.update({e.name: DIR_EXPORT for e in _entries(cache.root / "exports")
                      if is_sha256(e.name) and e.name not in names})
    for digest, name in names.items():
        for edir in _entries(cache.root / "exports" / _sha(digest)):
            n, fault = _check_export(edir, name, digest)
            checked += n
            if fault.problems:
                faults.append(fault)
    return checked, faults, {path for _, _, path in dirs}


def _late_links(cache: Cache, model: str | None, faults: list[_Fault], scanned: set[Path],
                hashes: dict[Path, str]) -> tuple[int, list[_Fault]]:
    """(files checked, faults) of the snapshots and parts published since the scan that link a
    blob the repair deletes: a pull beside the hashing found the corrupt blob in the store (a
    cache hit goes by size) and linked it, and would keep it once the blob is gone."""
    bad = {b for f in faults for b in f.blobs}
    checked, found = 0, []
    for h in cache.held(model) if bad else []:
        if h.path in scanned:
            continue
        want_of = _recorded(cache, h.model, h.digest, h.path)
        names = {f for f, sha in want_of.items() if is_sha256(str(sha)) and cache.blob(sha) in bad}
        if names:
            n, fault = _check_held(cache, h.model, h.digest, h.path, hashes, names)
            checked += n
            if fault.problems:
                found.append(fault)
    return checked, found


def _check_held(cache: Cache, name: str, digest: str, path: Path, hashes: dict[Path, str],
                only: set[str] | None = None) -> tuple[int, _Fault]:
    """(files checked, fault) for a snapshot or part: all its files, or those named in `only`.
    A directory gone since is no longer at fault."""
    want_of = _recorded(cache, name, digest, path)
    files = sorted(p for p in path.iterdir() if not p.name.startswith(".")) if path.is_dir() else []
    if only is not None:
        files = [f for f in files if f.name in only]
    problems, blobs = [], set()
    for f in files:
        why, blob = _check_file(cache, f, want_of.get(f.name), hashes)
        if why:
            problems.append(Problem(name, digest, f.name, why))
        if blob is not None:
            blobs.add(blob)
    wrong = {p.file for p in problems}
    return len(files), _Fault(path, problems, blobs,
                              lambda h: _check_held(cache, name, digest, path, h, wrong)[1])


def _recorded(cache: Cache, name: str, digest: str, path: Path) -> dict:
    """The sha256 each file of a snapshot or part should have, by the cache's own records."""
    want_of = dict(cache.read_meta(name, digest).get("files") or {})
    if (path / CACHED_PART).exists():
        want_of = json.loads((path / CACHED_PART).read_text())
    want_of["bundle.json"] = digest
    return want_of


def _check_file(cache: Cache, f: Path, want: str | None,
                hashes: dict[Path, str]) -> tuple[str | None, Path | None]:
    """What is wrong with one file of a snapshot or part (None if nothing), and the corrupt blob
    to blame, if that is why. `hashes` spares a blob many snapshots link a second hashing."""
    if not (want and is_sha256(want)):
        return "not recorded in the cache's metadata", None
    target = cache.blob(want)
    if not target.exists():
        return "missing blob", None
    got = hashes.get(target) or hashes.setdefault(target, sha256_file(target))
    if got != want:
        return f"sha256 {got[:12]}... should be {want[:12]}...", target
    if not os.path.samefile(f, target) and sha256_file(f) != want:
        return "the snapshot's copy was modified", None
    return None, None


def _check_export(edir: Path, name: str, digest: str) -> tuple[int, _Fault]:
    """(files checked, fault) for one export built from a bundle; a problem's file is
    exports/<dir>/<file>. A directory gone since is no longer at fault."""
    from .export import verify_export

    # None: from an older oscar-zoo, rebuilt (with checksums) when next used
    result = verify_export(edir) if edir.is_dir() else None
    checked, found = result or (0, [])
    problems = [Problem(name, digest, f"exports/{edir.name}/{f}", why) for f, why in found]
    return checked, _Fault(edir, problems, set(), lambda _: _check_export(edir, name, digest)[1])


def _repair(cache: Cache, faults: list[_Fault]) -> None:
    # the refs of a bundle that goes first, as cache rm drops them: a ref left naming a
    # snapshot that is gone would have an offline pull list it as cached; a crash after this
    # leaves a snapshot no ref names, which prune removes
    _drop_refs_of_gone(cache, {f.path for f in faults})
    for blob in {b for f in faults for b in f.blobs}:
        if blob.parent == cache.blobs:
            blob.unlink(missing_ok=True)
    # renamed aside first (_delete): a snapshot killed half-deleted would be trusted whole; an
    # export is built again from its snapshot on its next use
    for fault in faults:
        _delete(cache, fault.path)


def _drop_refs_of_gone(cache: Cache, going: set[Path]) -> None:
    """Remove the refs naming a bundle of which nothing stays once `going` (snapshots, --layers
    parts, exports) is removed: its snapshot goes and so does each of its parts, or it has no
    part. A bundle that keeps a part keeps its refs (the part still serves its layers).

    Call with gc.lock held exclusively (verify's repair), as drop_refs says."""
    models = cache.root / "models"
    bundles: set[tuple[Path, str]] = set()
    for path in going:
        if path.parent.name == "snapshots" and path.parent.parent.parent == models:
            bundles.add((path.parent.parent, path.name))
        elif path.parent.parent.name == "partial" and path.parents[2].parent == models:
            bundles.add((path.parents[2], path.parent.name))
    for mdir, digest in sorted(bundles):
        held = [p for p in [mdir / "snapshots" / digest, *(mdir / "partial" / digest).glob("layers-*")]
                if p.is_dir()]
        if not is_sha256(digest) or not set(held) <= going:
            continue
        drop_refs(cache, mdir.name, [p.name for p in _entries(mdir / "refs")
                                     if p.is_file() and _read_digest(p) == digest])


def drop_refs(cache: Cache, model: str, refs: Iterable[str]) -> None:
    """Unlink these refs of one model (file names in models/<model>/refs/ as listed there:
    Cache.refs' keys), then fsync the refs dir once if any was named: durable before the caller
    deletes the bundles they named, so a crash leaves a bundle no ref names (prune removes it),
    never a ref to one that is gone. A ref already gone is no error.

    Names as listed, not through _ref_file: that one is for names oscar-zoo writes, and would
    refuse a hand-made `v3:draft` or unlink `latest` for a listed `latest ` (it strips).
    Raises UnsafePathError, unlinking nothing, for a name that is no file of that dir.

    Call with gc.lock held exclusively (cache rm, verify's repair): pulls, which write refs
    holding it shared, wait; each unlink is atomic."""
    folder = cache.root / "models" / model / "refs"
    names = list(refs)
    for name in names:
        # e.g. "../meta", or "d:x" on Windows (the current dir of drive D), never listed there
        if name in ("", ".", "..") or (folder / name).parent != folder:
            raise UnsafePathError(f"ref {name!r} of {model} is not a file name in {folder}; "
                                  "nothing was removed")
    for name in names:
        (folder / name).unlink(missing_ok=True)
    if names:
        fsync_dir(folder)


def prune(cache: Cache, dry_run: bool = False,
          only: set[Path] | None = None) -> list[tuple[Path, int]]:
    """Remove what nothing points at: snapshots no ref names (and their meta and exports),
    blobs no snapshot uses, import records of bundles no longer held, stale partial downloads
    and temp dirs; then the directory of a model left with nothing. Returns [(path, bytes)].

    Waits for pulls in progress (their blobs have no ref yet). `only`: remove no more than
    these paths, the list a user confirmed; what became garbage since stays for the next prune.
    """
    if not cache.root.exists():
        return []
    with cache.gc_guard(exclusive=True):
        gone = _garbage(cache)
        if only is not None:
            gone = [(p, n) for p, n in gone if p in only]
        gone = _freed([p for p, _ in gone])   # a snapshot's hard links to its blobs count once
        if not dry_run:
            for path, _ in gone:
                _delete(cache, path)
            drop_emptied_model_dirs(cache, [p for p, _ in gone])
    return gone


def _garbage(cache: Cache) -> list[tuple[Path, int]]:
    gone: list[tuple[Path, int]] = []
    live: set[tuple[str, str]] = set()
    for mdir in model_dirs(cache):
        refs = set(cache.refs(mdir.name).values())
        for snap in _entries(mdir / "snapshots"):
            if snap.name in refs:
                live.add((mdir.name, snap.name))
            else:
                gone.append((snap, _size(snap)))
        for part in _entries(mdir / "partial"):
            if part.name in refs:
                live.add((mdir.name, part.name))
            else:
                gone.append((part, _size(part)))
        for meta in sorted((mdir / "meta").glob("*.json")):
            if (mdir.name, meta.stem) not in live:
                gone.append((meta, meta.stat().st_size))
        gone += [(p, _size(p)) for p in _dead_imports(mdir, live)]
    digests = {d for _, d in live}
    for exp in _entries(cache.root / "exports"):
        if exp.name not in digests:
            gone.append((exp, _size(exp)))
    doomed = {p for p, _ in gone}
    gone += [(p, _size(p)) for p in _stale_staging(cache) if not doomed & {p, *p.parents}]
    keep = _blobs_of(cache, live)
    for blob in sorted(cache.blobs.glob("*")) if cache.blobs.exists() else []:
        if blob.name.endswith(_LEFTOVERS):
            if time.time() - _last_touched(blob) > _LEFTOVER_AGE:  # nobody resumes or adopts it now
                gone.append((blob, _size(blob)))
        elif is_sha256(blob.name) and blob.name not in keep and blob not in doomed:
            gone.append((blob, blob.stat().st_size))
    tmp = cache.root / "tmp"
    for t in sorted(tmp.glob("*")) if tmp.exists() else []:
        if time.time() - t.stat().st_mtime > 3600:
            gone.append((t, _size(t)))
    return gone


def _dead_imports(mdir: Path, live: set[tuple[str, str]]) -> list[Path]:
    """The import records (imports/<key>) of a model that name no bundle it keeps, whole or in
    part: they keep nothing, and a pull converts the .pt files again rather than trust one."""
    return [p for p in _entries(mdir / "imports") if (mdir.name, _read_digest(p)) not in live]


def _read_digest(path: Path) -> str | None:
    """The digest a ref-like text file (an import record) names; None for one that names none."""
    try:
        value = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if is_sha256(value) else None


def _inodes(paths: list[Path]) -> Iterator[tuple[int, tuple[int, int], os.stat_result]]:
    """(index of the path, (dev, ino), stat) for each file or link the paths hold, each file
    once (a model directory listed after its snapshots adds only what they left)."""
    seen: set[Path] = set()
    for i, path in enumerate(paths):
        if path.is_symlink() or not path.is_dir():
            files = [path]
        else:
            files = [p for p in path.rglob("*") if p.is_symlink() or not p.is_dir()]
        for f in files:
            if f in seen:
                continue
            seen.add(f)
            try:
                st = f.lstat()
            except FileNotFoundError:
                continue
            yield i, (st.st_dev, st.st_ino), st


def _links(paths: list[Path]) -> dict[tuple[int, int], int]:
    """How many links to each inode (dev, ino) the paths hold."""
    out: dict[tuple[int, int], int] = {}
    for _, key, _ in _inodes(paths):
        out[key] = out.get(key, 0) + 1
    return out


def _freed(paths: list[Path]) -> list[tuple[Path, int]]:
    """Each path with the bytes its removal frees, the others removed too: a file's bytes count
    at the last path holding one of its links (a blob, after the snapshots linking it), and not
    at all while a link outside the paths keeps it."""
    seen: dict[tuple[int, int], list] = {}     # inode -> [links seen, nlink, size, last path]
    for i, key, st in _inodes(paths):
        entry = seen.setdefault(key, [0, st.st_nlink, st.st_size, i])
        entry[0] += 1
        entry[3] = i
    freed = [0] * len(paths)
    for count, nlink, size, i in seen.values():
        if count >= nlink:
            freed[i] += size
    return list(zip(paths, freed))


def _blobs_of(cache: Cache, bundles: Iterable[tuple[str, str]]) -> set[str]:
    """The sha256 of every blob the bundles (model, digest) use: their bundle.json, the files of
    their snapshot and --layers parts, the RotationZoo .pt files they were converted from."""
    used: set[str] = set()
    for name, digest in bundles:
        used.add(digest)
        for part in (cache.model_dir(name) / "partial" / digest).glob(f"layers-*/{CACHED_PART}"):
            used.add(json.loads(part.read_text()).get("rotations.safetensors", ""))
        meta = cache.read_meta(name, digest)
        used.update(v for v in (meta.get("files") or {}).values() if is_sha256(str(v)))
        used.update(v for v in (meta.get("origin_files") or {}).values() if is_sha256(str(v)))
    return used


def _delete(cache: Cache, path: Path) -> bool:
    """Remove one cache entry; False if some of it is still there (permissions, a busy file).

    A file (or a link: never followed) is unlinked. A directory is first renamed aside into
    tmp/, one atomic step, so whoever looks finds it whole or not at all, never half-deleted;
    then deleted there. A crash in between leaves a tmp/ entry that prune ages out."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return not os.path.lexists(path)
    trash = cache.root / "tmp"
    if path.parent == trash:
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
    try:
        trash.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=f"removed-{path.name}.", dir=trash))
    except OSError:
        aside = None
    if aside is None:
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.rename(path, aside / path.name)
        except FileNotFoundError:       # gone already
            pass
        except OSError:                 # another filesystem mounted under the cache: in place
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)
    return not os.path.lexists(path)


_MODEL_PARTS = ("snapshots", "partial", "meta", "imports", "refs")


def drop_emptied_model_dirs(cache: Cache, removed: Iterable[Path]) -> None:
    """Remove models/<name>/ of each model that lost one of `removed`, once nothing is left in it
    but empty folders: else a model whose last bundle went stays behind as a bare directory.

    Call with gc.lock held exclusively (prune, cache rm): pulls, the only writers under models/,
    create these folders under it held shared. rmdir never removes a file, nor a folder holding
    one (a staging dir a killed pull left is aged out by prune), so what is in use stays."""
    models = cache.root / "models"
    touched = {models / p.relative_to(models).parts[0] for p in removed if models in p.parents}
    for mdir in sorted(touched):
        if mdir.is_symlink():   # never followed: not a directory oscar-zoo made
            continue
        for part in _MODEL_PARTS:
            _rmdir_if_empty(mdir / part)
        _rmdir_if_empty(mdir)


def _rmdir_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:     # not empty, gone already, or not ours to remove: it stays
        pass


def _hub_id_of(cache: Cache, model: str) -> str | None:
    """The hub id the manifest of a bundle held for `model` names (every bundle of one model
    names the same); None where none can be read. The manifest, not the meta: meta written
    before hub ids mattered here does not carry it, every cached bundle.json does."""
    for held in cache.held(model):
        try:
            hub_id = json.loads((held.path / "bundle.json").read_text())["model"]["hub_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(hub_id, str):
            return hub_id
    return None


def _same_key(hub_id: str, key: str) -> bool:
    try:
        return model_key(hub_id) == key
    except UnsafePathError:     # a manifest's hub id no directory could be named after
        return False


def model_dirs(cache: Cache) -> list[Path]:
    """The model directories under models/: a .DS_Store, a link or a directory made by hand
    under a name no model has (`a..b`) is not one, and is left alone rather than stop prune."""
    out = []
    for p in _entries(cache.root / "models"):
        try:
            ours = model_key(p.name) == p.name
        except UnsafePathError:
            ours = False
        if ours and p.is_dir() and not p.is_symlink():
            out.append(p)
    return out


def _entries(folder: Path) -> list[Path]:
    # a hidden name is a staging dir (files.staging_dir) of a pull or export that may be running
    # now: it is not a snapshot without a ref, and _stale_staging ages it out instead
    return sorted(p for p in folder.glob("*") if not p.name.startswith("."))


def _subdirs(folder: Path) -> list[Path]:
    """The directories in it, links and hidden names (staging dirs) aside."""
    return [p for p in _entries(folder) if p.is_dir() and not p.is_symlink()]


def _rescued(folder: Path) -> Rescued | None:
    """What one dir under rescued/ holds now; None once it is gone (moved or removed while we
    looked, or its bundle renamed into it mid-walk: a listing a moment later finds it whole)."""
    try:
        saved = folder.lstat().st_mtime     # needs rescued/ only, which we just listed
    except FileNotFoundError:
        return None
    try:
        contents = _contents(folder)
    except FileNotFoundError:
        return None
    except OSError:     # PermissionError: another user's (mkdtemp makes it 0700)
        return Rescued(folder.name, folder, None, saved, saved, None, None)
    # a bundle's staging dir (.NAME.*.partial) is hidden: a calibrate killed while writing it
    # leaves its rescued dir with no bundle in it
    bundles = sorted(p for p, kind, _, _ in contents
                     if kind == "d" and os.sep not in p and not p.startswith("."))
    touched = max([saved] + [t / 1e9 for _, _, _, t in contents])
    size = sum(n for _, kind, n, _ in contents if kind != "d")
    return Rescued(folder.name, folder, folder / bundles[0] if bundles else None, saved, touched,
                   size, contents)


def _contents(folder: Path) -> tuple[tuple[str, str, int, int], ...]:
    """(path under folder, d/l/f, size, mtime_ns) of everything in it, links not followed: what
    any write into it changes (a file written, a staging dir renamed). OSError where a dir in
    it cannot be read: not a partial answer."""
    out, todo = [], [folder]
    while todo:
        with os.scandir(todo.pop()) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                kind = "l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False) else "f"
                out.append((os.path.relpath(e.path, folder), kind, st.st_size, st.st_mtime_ns))
                if kind == "d":
                    todo.append(Path(e.path))
    return tuple(sorted(out))


def _stale_staging(cache: Cache) -> list[Path]:
    """Staging dirs (.NAME.*.partial) a killed pull or export left beside the snapshot, part or
    export it was building; the finally that removes them does not run on SIGKILL."""
    spots = ["models/*/snapshots", "models/*/partial/*", "exports/*"]
    found = [p for spot in spots for p in cache.root.glob(f"{spot}/.*.partial") if p.is_dir()]
    return sorted(p for p in found if time.time() - _last_touched(p) > _LEFTOVER_AGE)


def _last_touched(path: Path) -> float:
    """Newest mtime in the tree: ModelScope writes a workdir's download a few folders down,
    which leaves the workdir's own mtime at its creation, however long the download runs."""
    try:
        times = [path.lstat().st_mtime]
        if path.is_dir() and not path.is_symlink():
            times += [p.lstat().st_mtime for p in path.rglob("*")]
    except FileNotFoundError:  # renamed while we looked: a download is finishing right now
        return time.time()
    return max(times)


def _size(path: Path) -> int:
    """Bytes of every file and link (a link's own, never followed) in it, as _freed counts what
    a removal frees."""
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_symlink() or not p.is_dir())
