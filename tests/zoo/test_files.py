"""zoo/files.py: staging and publishing directories."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import threading

import pytest

from oscar_zoo.zoo import files
from oscar_zoo.zoo.files import atomic_write_bytes, publish_dir, staging_dir


def test_publish_gives_new_files_a_plain_mode_and_leaves_hard_links_alone(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"shared")
    os.chmod(blob, 0o444)
    final = tmp_path / "snap"
    with staging_dir(final) as tmp:
        os.link(blob, tmp / "linked")
        atomic_write_bytes(tmp / "own", b"new")
        publish_dir(tmp, final)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)   # noqa: E731
    umask = os.umask(0)
    os.umask(umask)
    assert mode(blob) == 0o444 and mode(final / "linked") == 0o444
    assert mode(final / "own") == 0o666 & ~umask and mode(final) == 0o777 & ~umask


def _publish(final, text, overwrite=True):
    with staging_dir(final) as tmp:
        (tmp / "data").write_text(text)
        publish_dir(tmp, final, overwrite=overwrite)


def _hidden(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_overwrite_swaps_in_the_new_tree_and_removes_the_old_one(tmp_path):
    final = tmp_path / "snap"
    _publish(final, "old", overwrite=False)
    (final / "only-in-old").write_text("x")
    _publish(final, "new")
    assert (final / "data").read_text() == "new" and not (final / "only-in-old").exists()
    assert _hidden(tmp_path) == []      # no .snap.old, no staging dir holding the old tree


def test_a_reader_never_finds_the_directory_missing_while_it_is_overwritten(tmp_path):
    final = tmp_path / "snap"
    _publish(final, "0", overwrite=False)
    missing, seen, stop = [], set(), threading.Event()
    # The gap of a two-rename overwrite lasts microseconds: a fast switch interval and many
    # publishes make a reader land in it reliably (hundreds of times in 500 publishes).
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def read():
        while not stop.is_set():
            try:
                with open(final / "data") as f:
                    seen.add(f.read())
            except FileNotFoundError:
                missing.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(1, 500):
            _publish(final, str(i))
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(old_interval)
    assert len(seen) > 1 and missing == []
    assert (final / "data").read_text() == "499"


def test_without_rename_exchange_overwrite_still_works(tmp_path, monkeypatch):
    # Simulates a filesystem without RENAME_EXCHANGE (renameat2 answers EINVAL there):
    # publish_dir must fall back to its two renames.
    refused = []

    def no_exchange(a, b):
        refused.append(b)
        raise OSError(errno.EINVAL, "Invalid argument", str(a))

    monkeypatch.setattr(files, "_exchange", no_exchange)
    final = tmp_path / "snap"
    _publish(final, "old", overwrite=False)
    _publish(final, "new")
    assert refused == [final]
    assert (final / "data").read_text() == "new" and _hidden(tmp_path) == []


def test_a_publish_cut_between_its_two_renames_is_healed(tmp_path):
    # What a crash between the fallback's two renames leaves: the old tree at .snap.old only.
    final, old = tmp_path / "snap", tmp_path / ".snap.old"
    _publish(final, "old", overwrite=False)
    os.rename(final, old)
    with pytest.raises(FileExistsError):
        _publish(final, "new", overwrite=False)      # the old tree is back: it still exists
    assert (final / "data").read_text() == "old" and _hidden(tmp_path) == []
    os.rename(final, old)
    _publish(final, "new")
    assert (final / "data").read_text() == "new" and _hidden(tmp_path) == []


def test_a_leftover_old_tree_beside_a_published_one_is_removed(tmp_path):
    # What a crash after the fallback's second rename leaves: both trees.
    final = tmp_path / "snap"
    _publish(final, "old", overwrite=False)
    shutil.copytree(final, tmp_path / ".snap.old")
    files.heal_dir(final)
    assert (final / "data").read_text() == "old" and _hidden(tmp_path) == []


def test_atomic_writers_rename_nothing_until_every_file_is_on_disk(tmp_path, monkeypatch):
    """K and V written together: a failure (here an fsync, as a full disk or Ctrl-C would give)
    after the first file is complete leaves both old files, and no temp file."""
    from oscar_zoo.zoo.files import atomic_writers

    paths = [tmp_path / "k.pt", tmp_path / "v.pt"]
    for p in paths:
        p.write_bytes(b"OLD")
    real, calls = os.fsync, []

    def fsync_failing_second(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync_failing_second)
    with pytest.raises(KeyboardInterrupt):
        with atomic_writers(paths) as (k, v):
            k.write(b"NEW")
            v.write(b"NEW")
    monkeypatch.setattr(os, "fsync", real)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {"k.pt": b"OLD", "v.pt": b"OLD"}
    with atomic_writers(paths) as (k, v):
        k.write(b"NEW")
        v.write(b"NEW!")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {"k.pt": b"NEW", "v.pt": b"NEW!"}


def test_atomic_writers_refuse_a_directory_in_the_way_before_writing(tmp_path):
    from oscar_zoo.zoo.files import atomic_writers

    (tmp_path / "k.pt").write_bytes(b"OLD")
    (tmp_path / "v.pt").mkdir()
    with pytest.raises(IsADirectoryError):
        with atomic_writers([tmp_path / "k.pt", tmp_path / "v.pt"]) as (k, v):
            k.write(b"NEW")
    assert (tmp_path / "k.pt").read_bytes() == b"OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pt", "v.pt"]
