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
