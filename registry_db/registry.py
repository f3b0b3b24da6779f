"""A registry on disk: the database plus the blob store, opened and made ready in one call."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from sqlalchemy.exc import IntegrityError as DBIntegrityError

from ..zoo import settings
from ..zoo.errors import Conflict
from ..zoo.files import out_of_space
from . import migrate
from .blobs import FREE_SPACE, BlobStore
from .models import Job
from .publish import Publication, model_for, prepare_bundle, record_version, store_blobs
from .seed import seed_catalog
from .session import Database, default_url
from .tokens import check_live

log = logging.getLogger("oscar_zoo.registry")
STAGING = "staging"


@dataclass
class Registry:
    db: Database
    blobs: BlobStore
    data_dir: Path

    def publish(self, bundle_dir: str | Path, created_by: str | None = None,
                source_job: str | None = None, status: str | None = None,
                model_name: str | None = None, token_id: int | None = None) -> Publication:
        """Verify and publish a bundle directory, holding the write lock only for the insert.

        Order: verify (no side effects) -> check the model and geometry (read) -> blobs (atomic)
        -> one write transaction. Raises BundleFormatError, IntegrityError, InvalidInput,
        YankedVersion, Conflict (a source_job naming one of this registry's jobs), Unauthorized
        (`token_id`, the uploading request's token, revoked during the upload); a rejected bundle
        leaves no row (blobs already stored wait for collect_garbage). `status` None: published,
        or a draft when the bundle's validation failed (publish.default_status).
        """
        prepared = prepare_bundle(bundle_dir)
        with self.db.read() as session:
            model_for(session, prepared.manifest, model_name, create=False)
            # a job's result is the version naming it as source_job: only the job's worker, holding
            # its lease, may record that (POST /v1/jobs/{id}/result). Job ids are random uuids, so
            # a job that does not exist yet cannot be named
            if source_job and session.get(Job, source_job) is not None:
                raise Conflict(f"source_job {source_job} is a calibration job of this registry; its "
                               "worker uploads the job's result: leave source_job out of this upload")
        store_blobs(self.blobs, prepared)
        with self.db.write() as session:
            if token_id is not None:
                check_live(session, token_id)
            model = model_for(session, prepared.manifest, model_name, created_by=created_by)
            return record_version(session, model, prepared, created_by, source_job, status)

    @contextmanager
    def staging(self, prefix: str, doing: str = "making a staging dir for an upload",
                then: str = FREE_SPACE) -> Iterator[Path]:
        """A fresh dir under `<data_dir>/staging` for an upload's files (or a mirror's), removed
        afterwards. `doing` and `then` word the StorageFull of a disk too full to make it.

        flocked while in use: a server killed mid-upload leaves its dir behind, and
        collect_garbage removes such a dir once it is old, never one whose upload is alive.
        """
        root = self.data_dir / STAGING
        with out_of_space("the registry's data dir", doing, then, self.data_dir):
            root.mkdir(parents=True, exist_ok=True)
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else knows the name yet: never waits
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)

    def collect_garbage(self, min_age_s: float = 3600) -> list[str]:
        """Remove blobs no version references (left by a crash between blob and commit), and
        staging dirs of uploads that died. Returns the removed blobs' hashes."""
        from sqlalchemy import select

        from .models import VersionFile

        with self.db.read() as session:
            referenced = set(session.scalars(select(VersionFile.sha256).distinct()))
        removed = self.blobs.collect_garbage(referenced, min_age_s)
        root = self.data_dir / STAGING
        for p in sorted(root.iterdir()) if root.is_dir() else ():
            _remove_if_abandoned(p, min_age_s)
        return removed

    def close(self) -> None:
        self.db.dispose()


def _remove_if_abandoned(path: Path, min_age_s: float) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False            # its upload ended meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False        # its upload is alive, however slow
        # The age still counts: a dir just made is flocked only a moment later, and a server
        # of an older release holds no flock on its dirs.
        if time.time() - os.fstat(fd).st_mtime <= min_age_s:
            return False
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("removed %s, left in the staging dir by an upload that did not finish", path.name)
        return True
    finally:
        os.close(fd)


def open_registry(database_url: str | None = None, data_dir: str | Path | None = None,
                  upgrade_empty: bool = True) -> Registry:
    """Open (and on an empty database, create) a registry, and sync the catalog into it.

    The database is `database_url`, else OSCAR_ZOO_DATABASE_URL, else SQLite in the data dir.
    Raises SchemaOutOfDate when an existing database needs `oscar-zoo db upgrade`.
    """
    data_dir = Path(data_dir) if data_dir is not None else settings.get("data_dir")
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(database_url or settings.raw("database_url") or default_url(data_dir))
    migrate.ensure_schema(db, upgrade_empty=upgrade_empty)
    sync_catalog(db)
    return Registry(db, BlobStore(data_dir), data_dir)


def sync_catalog(db: Database) -> int:
    for attempt in range(3):
        try:
            with db.write() as session:
                return seed_catalog(session)
        except DBIntegrityError:  # another replica seeded at the same moment; look again
            if attempt == 2:
                raise
    return 0
