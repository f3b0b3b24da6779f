"""Mirror records in the database (registry_db/mirrors.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from oscar_zoo.registry_db.mirrors import record_mirror
from oscar_zoo.registry_db.models import MirrorRecord
from tests.utils.bundles import make_bundle


def test_two_runs_recording_one_mirror_at_once_both_land(registry, tmp_path):
    """A publish's background mirror and `oscar-zoo mirror` both found no record and both
    inserted one: the second died on the unique index (PostgreSQL) and its run was lost."""
    if registry.db.is_sqlite:
        pytest.skip("SQLite has one writer: the two transactions cannot overlap")
    version_id = registry.publish(make_bundle(tmp_path / "b").path).version.id
    errors: list[BaseException] = []

    def second():
        try:
            with registry.db.write() as s:
                record_mirror(s, version_id, "hf", "org/repo", "done", path="SmolLM2", revision="abc")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with registry.db.write() as s:
        record_mirror(s, version_id, "hf", "org/repo", "pending")
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.5)         # the second run now waits on this one's row
    t.join(30)
    assert not errors, errors
    with registry.db.read() as s:
        rows = list(s.scalars(select(MirrorRecord).where(MirrorRecord.version_id == version_id)))
        assert [(r.status, r.revision) for r in rows] == [("done", "abc")]
        assert s.scalar(select(func.count()).select_from(MirrorRecord)) == 1
