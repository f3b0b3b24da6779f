"""Mirror registry versions to the hubs (zoo/mirror does the hub side) and keep the records:
where each version went (hub, repo, folder, commit).

One row per (version, target, repo), updated in place as a mirror job goes pending -> done or
failed; `GET /v1/models/{name}/versions/{v}/mirrors` reads them (queries.mirrors).
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..zoo import settings
from ..zoo.mirror.runner import MirrorResult, configured_targets, mirror_bundle, parse_target
from . import queries
from .models import BundleVersion, MirrorRecord

log = logging.getLogger("oscar_zoo.mirror")


@dataclass(frozen=True)
class VersionFiles:
    """What a mirror needs of a version, read in one short transaction."""

    version_id: int
    model: str
    number: int
    digest: str
    files: dict[str, Path]          # bundle file name -> verified blob path


def version_files(registry, model: str, ref: str | int) -> VersionFiles:
    """Resolve model@ref and locate its files in the blob store (each re-hashed once).

    Raises ModelNotFound, VersionNotFound, StorageCorrupt.
    """
    with registry.db.read() as session:
        m = queries.resolve_model(session, model)
        v = queries.resolve_version(session, m, ref)
        names = {f.name: f.sha256 for f in v.files}
        out = VersionFiles(v.id, m.name, v.number, v.digest, {})
    for name, sha in names.items():
        out.files[name] = registry.blobs.verified_path(sha)
    return out


def record_mirror(session: Session, version_id: int, target: str, repo: str, status: str,
                  path: str | None = None, revision: str | None = None, url: str | None = None,
                  error: str | None = None) -> MirrorRecord:
    """Insert or update the record of one version on one hub repo."""
    row = session.scalar(select(MirrorRecord).where(
        MirrorRecord.version_id == version_id, MirrorRecord.target == target,
        MirrorRecord.repo == repo))
    if row is None:
        row = MirrorRecord(version_id=version_id, target=target, repo=repo)
        session.add(row)
    row.status = status
    row.error = error[:4000] if error else None
    if path is not None:
        row.path = path
    if revision is not None:
        row.revision = revision
    if url is not None:
        row.url = url
    session.flush()
    return row


# --- a registry version to every target --------------------------------------------------------

def mirror_version(registry, model: str, version: str | int,
                   targets: list[str] | None = None) -> list[MirrorResult]:
    """Mirror one registry version to each target and record the outcome per target.

    Raises ModelNotFound / VersionNotFound for a bad name, ConfigError for a bad target; hub
    failures are returned (status "failed") and recorded, not raised.
    """
    vf = version_files(registry, model, version)
    targets = list(targets) if targets else configured_targets(vf.model)
    for t in targets:
        parse_target(t)
    results = []
    with tempfile.TemporaryDirectory(prefix="oscar-zoo-mirror-") as tmp:
        bundle_dir = Path(tmp)
        for name, path in vf.files.items():
            _link_or_copy(path, bundle_dir / name)
        for target in targets:
            kind, repo = parse_target(target)
            with registry.db.write() as session:
                record_mirror(session, vf.version_id, kind, repo, "pending")
            with _repo_lock(registry, kind, repo):
                result = mirror_bundle(bundle_dir, vf.number, target)
            with registry.db.write() as session:
                record_mirror(session, vf.version_id, kind, repo, result.status, result.path,
                              result.revision, result.url, result.error)
            results.append(result)
    return results


def _repo_lock(registry, kind: str, repo: str):
    """One mirror run per hub repo at a time on this registry host: ModelScope has no
    parent-commit check, so two runs could each rewrite the index without the other's entry."""
    from filelock import FileLock

    path = Path(registry.data_dir) / "locks" / f"mirror-{kind}-{repo.replace('/', '--')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), timeout=max(float(settings.get("lock_timeout")), 600.0))


def mirror_after_publish(registry, publication, wait: bool = False) -> threading.Thread | None:
    """Mirror a freshly published version to the configured targets, in a background thread
    (publishing never waits on a hub). Call it after `Registry.publish`; returns the thread, or
    None when no target is configured for the model or the version is not published."""
    if publication.version.status != "published":
        return None
    with registry.db.read() as session:   # the publication's row is detached by now
        version = session.get(BundleVersion, publication.version.id)
        model, number = version.model.name, version.number
    if not configured_targets(model):
        return None
    thread = threading.Thread(target=_mirror_quietly, args=(registry, model, number),
                              name=f"mirror-{model}-v{number}", daemon=True)
    thread.start()
    if wait:
        thread.join()
    return thread


def _mirror_quietly(registry, model: str, number: int) -> None:
    try:
        mirror_version(registry, model, number)
    except Exception:  # a background job: log, the records say what happened
        log.exception("mirroring %s v%s failed", model, number)


def _link_or_copy(src: Path, dest: Path) -> None:
    import os
    import shutil

    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
