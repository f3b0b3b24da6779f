"""A registry on disk: the database plus the blob store, opened and made ready in one call."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import IntegrityError as DBIntegrityError

from ..zoo import settings
from ..zoo.errors import Conflict
from . import migrate
from .blobs import BlobStore
from .models import Job
from .publish import Publication, model_for, prepare_bundle, record_version, store_blobs
from .seed import seed_catalog
from .session import Database, default_url


@dataclass
class Registry:
    db: Database
    blobs: BlobStore
    data_dir: Path

    def publish(self, bundle_dir: str | Path, created_by: str | None = None,
                source_job: str | None = None, status: str = "published",
                model_name: str | None = None) -> Publication:
        """Verify and publish a bundle directory, holding the write lock only for the insert.

        Order: verify (no side effects) -> check the model and geometry (read) -> blobs (atomic)
        -> one write transaction. Raises BundleFormatError, IntegrityError, InvalidInput,
        YankedVersion, Conflict (a source_job naming one of this registry's jobs); a rejected
        bundle leaves no blob and no row.
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
            model = model_for(session, prepared.manifest, model_name, created_by=created_by)
            return record_version(session, model, prepared, created_by, source_job, status)

    def collect_garbage(self, min_age_s: float = 3600) -> list[str]:
        """Remove blobs no version references (left by a crash between blob and commit)."""
        from sqlalchemy import select

        from .models import VersionFile

        with self.db.read() as session:
            referenced = set(session.scalars(select(VersionFile.sha256).distinct()))
        return self.blobs.collect_garbage(referenced, min_age_s)

    def close(self) -> None:
        self.db.dispose()


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
