"""zoo/files.py: staging and publishing directories."""

from __future__ import annotations

import os
import stat

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
