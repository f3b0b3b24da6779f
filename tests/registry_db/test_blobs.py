"""The blob store: content-addressed, atomic, verified on write and on read."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from pathlib import Path

import pytest

from oscar_zoo.registry_db.blobs import BlobStore
from oscar_zoo.zoo.errors import IntegrityError, StorageCorrupt


def test_put_and_read_verified(tmp_path):
    store = BlobStore(tmp_path)
    data = os.urandom(3 << 20)
    sha = hashlib.sha256(data).hexdigest()
    assert store.put_bytes(data) == sha
    path = store.path(sha)
    assert path == tmp_path / "blobs" / "sha256" / sha and path.read_bytes() == data
    assert store.verified_path(sha) == path
    assert store.read_range(sha, 10, 20) == data[10:20]
    src = tmp_path / "src"
    src.write_bytes(data)
    assert store.put_file(src, sha, len(data)) == path  # idempotent


def test_mismatch_leaves_nothing(tmp_path):
    store = BlobStore(tmp_path)
    wrong = "0" * 64
    with pytest.raises(IntegrityError):
        store.put_stream(io.BytesIO(b"hello"), wrong)
    with pytest.raises(IntegrityError):
        store.put_stream(io.BytesIO(b"hello"), hashlib.sha256(b"hello").hexdigest(), size=4)
    assert list(store.root.iterdir()) == []  # no blob, no temp file
    with pytest.raises(IntegrityError, match="not a sha256"):
        store.path("../../etc/passwd")


def test_corruption_detected_on_read(tmp_path):
    store = BlobStore(tmp_path)
    sha = store.put_bytes(b"rotation bytes")
    store.verified_path(sha)
    store.path(sha).write_bytes(b"rotation bytez")
    with pytest.raises(StorageCorrupt):
        store.verified_path(sha)


def test_garbage_collection_spares_referenced_and_young(tmp_path):
    store = BlobStore(tmp_path)
    keep, old, young = (store.put_bytes(x) for x in (b"keep", b"old", b"young"))
    past = time.time() - 7200
    for sha in (keep, old):
        os.utime(store.path(sha), (past, past))
    assert store.collect_garbage({keep}) == [old]
    assert sorted(store.all()) == sorted([keep, young])


def test_garbage_collection_spares_a_blob_just_stored_again(tmp_path):
    """A publish whose bytes already lie in an old unreferenced blob (left by a crashed publish)
    stores them again before its commit; collecting garbage in between must not remove them."""
    store = BlobStore(tmp_path)
    src = tmp_path / "src"
    src.write_bytes(b"rotation bytes")
    sha = hashlib.sha256(b"rotation bytes").hexdigest()
    blobs = [store.put_bytes(b"card"), store.put_file(src, sha, 14).name,
             store.put_stream(io.BytesIO(b"manifest"), hashlib.sha256(b"manifest").hexdigest()).name]
    past = time.time() - 7200
    for blob in blobs:
        os.utime(store.path(blob), (past, past))
    store.put_bytes(b"card")
    store.put_file(src, sha, 14)
    store.put_stream(io.BytesIO(b"manifest"), hashlib.sha256(b"manifest").hexdigest())
    assert store.collect_garbage(set()) == []


def test_a_store_between_a_collections_age_check_and_unlink_keeps_the_blob(tmp_path, monkeypatch):
    """A publish storing bytes again while collect_garbage has found their old blob unreferenced
    and old, but not yet unlinked it: the publish then commits, so its blob must survive."""
    store = BlobStore(tmp_path)
    sha = store.put_bytes(b"rotation bytes")
    past = time.time() - 7200
    os.utime(store.path(sha), (past, past))
    racer: list[threading.Thread] = []
    real_unlink = os.unlink

    def unlink_after_a_store(path, *args, **kwargs):
        # os.unlink (not our code) is wrapped only to reach the one moment that matters: the
        # collection has checked the blob's age and is about to unlink it. The store runs in
        # another thread, as in another worker; it may have to wait for the collection, so it
        # gets 0.5 s (it needs microseconds when nothing makes it wait) before the unlink goes on.
        if Path(path) == store.path(sha) and not racer:
            racer.append(threading.Thread(target=store.put_bytes, args=(b"rotation bytes",)))
            racer[0].start()
            racer[0].join(timeout=0.5)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_after_a_store)
    store.collect_garbage(set())
    racer[0].join()
    assert store.path(sha).read_bytes() == b"rotation bytes"
    assert store.collect_garbage(set()) == []       # and it is young: the next collection spares it


def _crash_mid_write(store: BlobStore, sha: str) -> Path:
    """Kill -9 a process while it streams blob `sha` into `store`; returns the temp file it left."""
    import signal
    import subprocess
    import sys

    child = (
        "import sys, time\n"
        "from oscar_zoo.registry_db.blobs import BlobStore\n"
        "class Stalls:\n"
        "    n = 0\n"
        "    def read(self, k):\n"
        "        self.n += 1\n"
        "        if self.n > 2:\n"
        "            time.sleep(600)\n"
        "        return b'x' * (1 << 20)\n"
        f"BlobStore(sys.argv[1]).put_stream(Stalls(), {sha!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(store.root.parent.parent)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            temps = [p for p in store.root.iterdir() if p.name != sha]
            if temps and temps[0].stat().st_size >= 1 << 20:
                break
            time.sleep(0.02)
        else:
            pytest.fail(f"the writer never got half-way (exit code {proc.poll()})")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return temps[0]


def test_garbage_collection_removes_temp_files_of_a_crashed_write(tmp_path):
    store = BlobStore(tmp_path)
    left = _crash_mid_write(store, "0" * 64)
    assert store.collect_garbage(set()) == [] and left.exists()     # young: maybe a live write
    past = time.time() - 7200
    os.utime(left, (past, past))
    assert store.collect_garbage(set()) == []                       # it was never a blob
    assert list(store.root.iterdir()) == []


def test_garbage_collection_spares_the_temp_file_of_a_live_write(tmp_path):
    """A write stalled longer than min_age_s (a slow upload) is still alive: its temp file stays,
    and the blob lands when the bytes come."""
    store = BlobStore(tmp_path)
    data = b"rotation bytes" * 1000
    sha = hashlib.sha256(data).hexdigest()
    started, go_on = threading.Event(), threading.Event()

    class Stalls(io.BytesIO):
        def read(self, n=-1):
            if self.tell() > 0 and not go_on.is_set():
                started.set()
                go_on.wait(30)
            return super().read(min(n, 4096))

    writer = threading.Thread(target=store.put_stream, args=(Stalls(data), sha, len(data)))
    writer.start()
    try:
        assert started.wait(30)
        (temp,) = store.root.iterdir()
        past = time.time() - 7200
        os.utime(temp, (past, past))
        assert store.collect_garbage(set(), min_age_s=0) == [] and temp.exists()
    finally:
        go_on.set()
        writer.join()
    assert store.verified_path(sha).read_bytes() == data
    assert [p.name for p in store.root.iterdir()] == [sha]


def _rot(path: Path) -> None:
    """Flip one bit in place, as a failing disk does: same size, same inode, same mtime."""
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    with open(path, "r+b") as f:
        f.write(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("how", ["put_file", "put_stream", "put_bytes"])
def test_storing_good_bytes_again_repairs_a_rotted_blob(tmp_path, how):
    """StorageCorrupt tells the operator to restore the blob: storing (publishing, uploading) the
    good bytes again must then replace the rotted copy, not trust it for its size."""
    data = os.urandom(1 << 16)
    sha = BlobStore(tmp_path).put_bytes(data)
    _rot(BlobStore(tmp_path).path(sha))
    store = BlobStore(tmp_path)         # a process that has not read the blob before
    with pytest.raises(StorageCorrupt):
        store.verified_path(sha)
    src = tmp_path / "src"
    src.write_bytes(data)
    {"put_file": lambda: store.put_file(src, sha, len(data)),
     "put_stream": lambda: store.put_stream(io.BytesIO(data), sha, len(data)),
     "put_bytes": lambda: store.put_bytes(data)}[how]()
    assert store.verified_path(sha).read_bytes() == data
    assert BlobStore(tmp_path).verified_path(sha).read_bytes() == data   # and for others too
    assert [p.name for p in store.root.iterdir()] == [sha]


def test_storing_a_sound_blob_again_does_not_rewrite_it(tmp_path):
    """The common case stays cheap: a blob this process verified is touched, not copied again."""
    data = os.urandom(1 << 16)
    store = BlobStore(tmp_path)
    sha = store.put_bytes(data)
    inode = store.path(sha).stat().st_ino
    store.verified_path(sha)
    store.put_stream(io.BytesIO(b"never read"), sha)
    assert store.path(sha).stat().st_ino == inode
    assert BlobStore(tmp_path).put_bytes(data) == sha     # a fresh process hashes it once: sound
    assert store.path(sha).stat().st_ino == inode
