"""Schema: the migration builds exactly what the ORM models describe, on both backends."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, text

from oscar_zoo.registry_db import migrate
from oscar_zoo.registry_db.models import Base
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.registry_db.session import Database
from oscar_zoo.zoo.catalog import CATALOG
from oscar_zoo.zoo.errors import SchemaOutOfDate


def test_migration_matches_models(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db)
    assert migrate.current(db) == migrate.head()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
    assert diff == [], diff
    # Downgrade works too: nothing left but alembic's own table.
    from alembic import command

    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    with db.engine.connect() as conn:
        from sqlalchemy import inspect

        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    db.dispose()


def test_open_registry_migrates_empty_and_seeds_catalog(registry_db_url, tmp_path):
    registry = open_registry(registry_db_url, tmp_path / "data")
    with registry.db.read() as session:
        names = set(session.scalars(text("select name from models")))
    assert names == {e.name for e in CATALOG}
    registry.close()
    again = open_registry(registry_db_url, tmp_path / "data")  # idempotent on a live database
    from oscar_zoo.registry_db.registry import sync_catalog

    assert sync_catalog(again.db) == 0
    again.close()


def test_refuses_a_database_it_did_not_migrate(registry_db_url, tmp_path):
    db = Database(registry_db_url)
    with db.engine.begin() as conn:
        conn.execute(text("create table legacy (id integer)"))
    db.dispose()
    with pytest.raises(SchemaOutOfDate, match="oscar-zoo db upgrade"):
        open_registry(registry_db_url, tmp_path / "data")


def test_sqlite_pragmas(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/r.sqlite")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("pragma journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("pragma foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("pragma busy_timeout").scalar() == 30000
    db.dispose()


def test_0006_repairs_stuck_cancels_and_aliases_left_on_yanked_versions(registry_db_url):
    """Data written before the fixes: a queued job with a cancel pending (claim skips it: queued
    forever), `recommended` and `latest` on a yanked version."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from oscar_zoo.registry_db.models import Alias, AliasEvent, BundleVersion, Job, Model

    db = Database(registry_db_url)
    migrate.upgrade(db, "0005")
    with Session(db.engine) as s, s.begin():
        m = Model(name="m", hub_id="o/m", hub_id_lower="o/m", geometry={})
        gone = Model(name="gone", hub_id="o/gone", hub_id_lower="o/gone", geometry={})
        s.add_all([m, gone])
        s.flush()

        def version(model, number, status) -> int:
            # Core: the ORM writes every column of today's model (0012's extra_loss too)
            return s.execute(BundleVersion.__table__.insert().values(
                model_id=model.id, number=number, status=status, digest=f"{model.name}{number}",
                size=1, method={}, quantization={}, clip={}, calibration={}, manifest={},
            )).inserted_primary_key[0]
        v1, v2, v3 = version(m, 1, "published"), version(m, 2, "published"), version(m, 3, "yanked")
        g1 = version(gone, 1, "yanked")
        s.add_all([Alias(model_id=m.id, name="latest", version_id=v3),
                   Alias(model_id=m.id, name="recommended", version_id=v3),
                   Alias(model_id=m.id, name="stable", version_id=v1),
                   Alias(model_id=gone.id, name="latest", version_id=g1)])
        # Core, not ORM objects: the ORM writes every column of today's model, and those of
        # later migrations (0008's created_by_token_id) do not exist yet at 0005.
        s.execute(Job.__table__.insert(), [
            dict(id="stuck", spec={}, status="queued", phase="queued",
                 progress={"phase": "queued"}, cancel_requested=True),
            dict(id="waiting", spec={}, status="queued", phase="queued", progress={},
                 cancel_requested=False),
            dict(id="running", spec={}, status="running", phase="pass1", progress={},
                 cancel_requested=True)])
        ids = {"v1": v1, "v2": v2, "v3": v3, "g1": g1, "m": m.id, "gone": gone.id}
    migrate.upgrade(db)
    with Session(db.engine) as s:
        left = {(a.model_id, a.name): a.version_id for a in s.scalars(select(Alias))}
        assert left == {(ids["m"], "latest"): ids["v2"], (ids["m"], "stable"): ids["v1"]}
        moves = {(e.model_id, e.alias, e.from_version_id, e.to_version_id)
                 for e in s.scalars(select(AliasEvent))}
        assert moves == {(ids["m"], "latest", ids["v3"], ids["v2"]),
                         (ids["m"], "recommended", ids["v3"], None),
                         (ids["gone"], "latest", ids["g1"], None)}
        jobs = {j.id: j for j in s.scalars(select(Job))}
        assert (jobs["stuck"].status, jobs["stuck"].progress["phase"]) == ("cancelled", "cancelled")
        assert jobs["stuck"].finished_at is not None and jobs["stuck"].finished_at.tzinfo is not None
        assert jobs["waiting"].status == "queued" and jobs["running"].status == "running"
    db.dispose()


def _running_at_0009(db: Database) -> dict[str, str]:
    """Jobs as the release before 0010 and 0011 left them: a claimed one, a Ray one whose task
    attached, their tokens in plain text, and one with a cancel pending; the tokens by name."""
    from sqlalchemy.orm import Session

    from oscar_zoo.registry_db.models import Job

    migrate.upgrade(db, "0009")
    plain = {"claim": "0f" * 16, "ray-claim": "1e" * 16, "task": "2d" * 16}
    lease = dict(spec={}, status="running", phase="pass1", progress={"phase": "pass1"},
                 attempts=1, max_attempts=3, cancel_requested=False, lease_seconds=60.0,
                 lease_expires_at=datetime.now(timezone.utc) + timedelta(minutes=5), timings={},
                 task_token=None)   # every row the same keys: an insert of many takes the first's
    with Session(db.engine) as s, s.begin():
        # Core, not ORM objects: the ORM writes every column of today's model
        s.execute(Job.__table__.insert(), [
            dict(id="11111111-0000-0000-0000-000000000000", lease_holder="worker:1",
                 lease_token=plain["claim"], **lease),
            dict(id="22222222-0000-0000-0000-000000000000", lease_holder="ray-task:1",
                 lease_token=plain["ray-claim"], **{**lease, "task_token": plain["task"]}),
            dict(id="33333333-0000-0000-0000-000000000000", lease_holder="worker:2",
                 lease_token="3c" * 16, **{**lease, "cancel_requested": True})])
    return plain


def test_0011_hashes_the_stored_lease_tokens_and_their_workers_keep_the_leases(registry_db_url):
    """Workers holding a lease across the upgrade present the token they were given: it must
    still hold, though the row now keeps only its hash."""
    from oscar_zoo.registry_db import jobs
    from oscar_zoo.registry_db.tokens import hash_token
    from oscar_zoo.zoo.errors import LeaseLost

    db = Database(registry_db_url)
    plain = _running_at_0009(db)
    migrate.upgrade(db)
    with db.write() as s:
        claimed = jobs.get(s, "11111111-0000-0000-0000-000000000000")
        ray = jobs.get(s, "22222222-0000-0000-0000-000000000000")
        assert claimed.lease_token == hash_token(plain["claim"])
        assert (ray.lease_token, ray.task_token) == (hash_token(plain["ray-claim"]),
                                                     hash_token(plain["task"]))
        jobs.heartbeat(s, claimed.id, plain["claim"])
        jobs.report_progress(s, claimed.id, plain["claim"], "fitting")
        jobs.heartbeat(s, ray.id, plain["ray-claim"])            # the dispatcher's
        jobs.report_progress(s, ray.id, plain["task"], "fitting")  # the task's
    with pytest.raises(LeaseLost, match="attached task"), db.write() as s:
        jobs.report_progress(s, ray.id, plain["ray-claim"], "fitting")
    db.dispose()


def test_0011_downgrade_gives_the_running_jobs_back(registry_db_url):
    """The hashes cannot be turned back into tokens, and the older code compares tokens as they
    are: leases would be lost in silence, each job left running until its lease ran out and
    the sweep spent an attempt. They are given back as a worker shutting down gives them."""
    from alembic import command
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from oscar_zoo.registry_db.models import Job

    db = Database(registry_db_url)
    _running_at_0009(db)
    migrate.upgrade(db)
    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0010")
    with Session(db.engine) as s:
        got = {j.id[0]: j for j in s.scalars(select(Job))}
    for job in got.values():
        assert (job.lease_token, job.task_token, job.lease_holder) == (None, None, None)
    assert [(got[k].status, got[k].attempts) for k in "12"] == [("queued", 0), ("queued", 0)]
    assert "downgraded" in got["1"].progress["requeued"] and got["1"].timings == {}
    assert (got["3"].status, got["3"].finished_at is not None) == ("cancelled", True)
    db.dispose()


def test_0012_copies_each_versions_extra_loss_out_of_its_report(registry_db_url):
    """Versions published before 0012 sort by their extra loss as new ones do: the backfill
    reads the report as the pages always have (variant "bundle", its last row; a finite
    number, else none), in batches, on either backend; the downgrade drops the copy only."""
    from alembic import command
    from sqlalchemy import inspect, select
    from sqlalchemy.orm import Session

    from oscar_zoo.registry_db.models import BundleVersion, Model

    report = lambda *rows: {"passed": True, "variants": [dict(r) for r in rows]}
    odd = {1: report({"name": "bundle", "delta_nll": 0.0052}, {"name": "naive", "delta_nll": 0.04}),
           2: report({"name": "bundle", "delta_nll": 0}),                       # an int
           3: report({"name": "naive", "delta_nll": 0.04}),                     # no bundle row
           4: report({"name": "bundle", "delta_nll": True}),                    # not a number
           5: report({"name": "bundle", "delta_nll": "0.1"}),
           6: report({"name": "bundle"}),
           7: report({"name": "bundle", "delta_nll": 0.9}, {"name": "bundle", "delta_nll": -0.001}),
           8: {"passed": False}, 9: {"variants": None}, 10: None}
    want = {1: 0.0052, 2: 0.0, 7: -0.001}
    many = 1_234                # more than a batch of the backfill
    db = Database(registry_db_url)
    migrate.upgrade(db, "0011")
    with Session(db.engine) as s, s.begin():
        model = Model(name="m", hub_id="o/m", hub_id_lower="o/m", geometry={})
        s.add(model)
        s.flush()
        base = dict(model_id=model.id, status="published", size=1, method={}, quantization={},
                    clip={}, calibration={}, manifest={})
        # Core: the ORM would write 0012's column, not there yet
        s.execute(BundleVersion.__table__.insert(),
                  [dict(base, number=n, digest=f"d{n}", validation=v) for n, v in odd.items()])
        s.execute(BundleVersion.__table__.insert(),
                  [dict(base, number=n, digest=f"d{n}", validation=report(
                      {"name": "bundle", "delta_nll": n / 1e5})) for n in range(11, 11 + many)])
    migrate.upgrade(db)
    with Session(db.engine) as s:
        got = dict(s.execute(select(BundleVersion.number, BundleVersion.extra_loss)).all())
    assert {n: got[n] for n in odd} == {n: want.get(n) for n in odd}
    assert all(got[n] == n / 1e5 for n in range(11, 11 + many))
    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0011")
    with db.engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("bundle_versions")}
        assert "extra_loss" not in columns and "validation" in columns
        assert conn.scalar(select(func.count()).select_from(BundleVersion.__table__)) == 10 + many
    db.dispose()
