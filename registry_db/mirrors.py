"""Mirror registry versions to the hubs (zoo/mirror does the hub side) and keep the records:
where each version went (hub, repo, folder, commit).

One row per (version, target, repo), updated in place as a mirror job goes pending -> done or
failed; `GET /v1/models/{name}/versions/{v}/mirrors` reads them (queries.mirrors).
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlalchemy.orm import Session

from ..zoo import settings
from ..zoo.errors import ConfigError, Conflict, StorageFull
from ..zoo.files import out_of_space
from ..zoo.mirror.runner import (MirrorPlan, MirrorResult, configured_targets, mark_yanked,
                                 mirror_bundle, parse_target, plan_bundle, plan_yank)
from . import queries
from .models import BundleVersion, Job, MirrorRecord

log = logging.getLogger("oscar_zoo.mirror")


@dataclass(frozen=True)
class VersionFiles:
    """What a mirror needs of a version, read in one short transaction."""

    version_id: int
    model: str
    number: int
    digest: str
    status: str                     # published | draft | yanked
    yank_reason: str | None
    files: dict[str, Path]          # bundle file name -> verified blob path


def version_files(registry, model: str, ref: str | int) -> VersionFiles:
    """Resolve model@ref and locate its files in the blob store (each re-hashed once).

    Raises ModelNotFound, VersionNotFound, StorageCorrupt.
    """
    with registry.db.read() as session:
        m = queries.resolve_model(session, model)
        v = queries.resolve_version(session, m, ref)
        names = {f.name: f.sha256 for f in v.files}
        out = VersionFiles(v.id, m.name, v.number, v.digest, v.status, v.yank_reason, {})
    for name, sha in names.items():
        out.files[name] = registry.blobs.verified_path(sha)
    return out


def record_mirror(session: Session, version_id: int, target: str, repo: str, status: str,
                  path: str | None = None, revision: str | None = None, url: str | None = None,
                  error: str | None = None) -> MirrorRecord:
    """Insert or update the record of one version on one hub repo."""
    row = _record(session, version_id, target, repo)
    if row is None:
        try:
            with session.begin_nested():
                row = MirrorRecord(version_id=version_id, target=target, repo=repo)
                session.add(row)
        except DBIntegrityError:
            # two runs for one version and repo (a publish's background mirror beside
            # `oscar-zoo mirror`, two replicas) both found none: update the one that landed
            row = _record(session, version_id, target, repo)
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


def _record(session: Session, version_id: int, target: str, repo: str) -> MirrorRecord | None:
    return session.scalar(select(MirrorRecord).where(
        MirrorRecord.version_id == version_id, MirrorRecord.target == target,
        MirrorRecord.repo == repo).with_for_update())


# --- a registry version to every target --------------------------------------------------------

def mirror_version(registry, model: str, version: str | int,
                   targets: list[str] | None = None) -> list[MirrorResult]:
    """Mirror one registry version to each target and record the outcome per target.

    Raises ModelNotFound / VersionNotFound for a bad name, NotPublished for a draft or a
    yanked version, ConfigError for a bad target or none; hub failures are returned (status "failed")
    and recorded, not raised, and so is a registry that cannot stage the files (a full disk).
    """
    vf = version_files(registry, model, version)
    _require_published(vf)
    targets = _targets_of(vf, targets)
    results = []
    with ExitStack() as staged:
        try:
            bundle_dir = _stage(registry, vf, staged)
        except OSError as e:
            return _staging_failed(registry, vf, targets, e)
        for target in targets:
            kind, repo = parse_target(target)
            with registry.db.write() as session:
                record_mirror(session, vf.version_id, kind, repo, "pending")
            with _repo_lock(registry, kind, repo):
                result = mirror_bundle(bundle_dir, vf.number, target, vf.model)
            with registry.db.write() as session:
                record_mirror(session, vf.version_id, kind, repo, result.status, result.path,
                              result.revision, result.url, result.error)
            results.append(result)
    return results


def plan_version(registry, model: str, version: str | int,
                 targets: list[str] | None = None) -> list[MirrorPlan]:
    """What mirror_version would do on each target (`oscar-zoo mirror --dry-run`): the same
    refusals and targets, the files staged as for a run, each hub only read; nothing is
    recorded."""
    vf = version_files(registry, model, version)
    _require_published(vf)
    targets = _targets_of(vf, targets)
    with ExitStack() as staged:
        bundle_dir = _stage(registry, vf, staged)
        return [plan_bundle(bundle_dir, vf.number, t, vf.model) for t in targets]


def _targets_of(vf: VersionFiles, targets: list[str] | None) -> list[str]:
    """--to, else the configured targets; checked, and at least one."""
    # the registry's name, not the one typed (an alias or hub id), is what the globs match
    targets = list(targets) if targets else configured_targets(vf.model)
    if not targets:
        raise ConfigError(f"no mirror target for {vf.model}: pass --to hf:ORG/REPO or "
                          "modelscope:ORG/REPO, or set OSCAR_ZOO_MIRROR_TARGETS (an entry "
                          f"for every model, or GLOB=hf:ORG/REPO with a GLOB matching {vf.model})")
    for t in targets:
        parse_target(t)
    return targets


def _stage(registry, vf: VersionFiles, staged: ExitStack) -> Path:
    """The version's files in a staging dir of the registry's data dir (removed when `staged`
    closes). There, not in TMPDIR: on the blob store's filesystem the files are hard links,
    which take no room, and a TMPDIR on a full disk of its own failed every mirror; the dir is
    flocked while the mirror runs, and `db gc` removes one that a killed server left."""
    doing = f"staging {vf.model} v{vf.number}'s files for its mirrors"
    then = _not_mirrored(vf)
    bundle_dir = staged.enter_context(registry.staging("mirror-", doing, then))
    with out_of_space("the registry's data dir", doing, then, registry.data_dir):
        for name, path in vf.files.items():
            _link_or_copy(path, bundle_dir / name)
    return bundle_dir


def _not_mirrored(vf: VersionFiles) -> str:
    return ("nothing was sent to the hubs. To fix: the registry's operator frees space in its "
            "data dir (OSCAR_ZOO_DATA_DIR), where `oscar-zoo db gc` removes the blobs no version "
            "references and uploads that died; then `oscar-zoo mirror "
            f"{vf.model}@{vf.number}` mirrors it")


def _staging_failed(registry, vf: VersionFiles, targets: list[str],
                    e: OSError) -> list[MirrorResult]:
    """Every target recorded as failed, with why: a background mirror's exception only reaches
    the log, and left no record at all (not pending, not failed) to see or to act on."""
    error = str(e) if isinstance(e, StorageFull) else (
        # strerror, not str(e): the record is public (GET .../mirrors), the data dir's path not
        f"could not stage {vf.model} v{vf.number}'s files for its mirrors ({type(e).__name__}: "
        f"{e.strerror or type(e).__name__}); nothing was sent to the hubs: once that is fixed "
        f"(the server's log names the directory), `oscar-zoo mirror {vf.model}@{vf.number}` "
        "mirrors it")
    where = getattr(e, "path", None) or getattr(e, "filename", None)   # for the operator only
    log.error("%s v%s not mirrored: %s [%s]", vf.model, vf.number, error, where)
    results = []
    for target in targets:
        kind, repo = parse_target(target)
        with registry.db.write() as session:
            record_mirror(session, vf.version_id, kind, repo, "failed", error=error)
        results.append(MirrorResult(kind, repo, "failed", error=error))
    return results


class NotPublished(Conflict):
    """Only published versions go to the hubs: a draft is unreviewed, a yanked one withdrawn."""

    title = "Version not published"

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


def _require_published(vf: VersionFiles) -> None:
    where = f"{vf.model} v{vf.number}"
    if vf.status == "draft":
        raise NotPublished(f"{where} is a draft, and only published versions are mirrored: "
                           f"publish it (`oscar-zoo promote {vf.model}@{vf.number}`), which "
                           "mirrors it to the configured targets", vf.status)
    if vf.status == "yanked":
        raise NotPublished(f"{where} is yanked ({vf.yank_reason}) and is not mirrored anywhere "
                           "new; the mirrors that hold it are told when it is yanked", vf.status)


# --- a yank reaching the mirrors that hold the version -----------------------------------------

def mirror_yank(registry, model: str, version: str | int,
                targets: list[str] | None = None) -> list[MirrorResult]:
    """Record a yanked version as yanked in the index of every repo that holds it (its mirror
    records, or `targets`), so a pull from the mirror neither offers it as latest nor serves it
    without a warning. A failure is kept in the version's record (its error) until a run
    succeeds; `oscar-zoo mirror NAME@N` on a yanked version runs this again. A target the
    version was never mirrored to (no record of it there, as `mirror --status` shows) is
    skipped without asking its hub: there is no yank to record, and a yanked version is not
    mirrored anywhere new."""
    y = _yanked(registry, model, version)
    model, number, reason, held = y.model, y.number, y.reason, y.held
    results = []
    for target in list(targets) if targets else held:
        kind, repo = parse_target(target)
        if _repo_key(target) not in y.tried:
            results.append(_never_mirrored(kind, repo, model, number))
            continue
        with _repo_lock(registry, kind, repo):
            result = mark_yanked(target, model, number, reason)
        if target in held:
            error = None if result.status == "done" else (
                f"the yank has not reached this mirror yet ({result.error}); run `oscar-zoo "
                f"mirror {model}@{number}` to try again")
            with registry.db.write() as session:
                record_mirror(session, y.version_id, kind, repo, "done", error=error)
        results.append(result)
    return results


def plan_yank_version(registry, model: str, version: str | int,
                      targets: list[str] | None = None) -> list[MirrorPlan]:
    """What mirror_yank would change on each target (`--dry-run`): each hub only read."""
    y = _yanked(registry, model, version)
    plans = []
    for target in list(targets) if targets else y.held:
        kind, repo = parse_target(target)
        if _repo_key(target) in y.tried:
            plans.append(plan_yank(target, y.model, y.number, y.reason))
        else:
            plans.append(MirrorPlan(kind, repo, y.model, y.number, "skip",
                                    note=_never_mirrored(kind, repo, y.model, y.number).note))
    return plans


@dataclass(frozen=True)
class _Yanked:
    """A yanked version and the mirrors that may hold it, read in one short transaction."""

    model: str
    number: int
    version_id: int
    reason: str
    held: list[str]                 # targets whose record says done
    tried: set                      # _repo_key of every target with a record


def _yanked(registry, model: str, version: str | int) -> _Yanked:
    with registry.db.read() as session:
        m = queries.resolve_model(session, model)
        v = queries.resolve_version(session, m, version)
        if v.status != "yanked":
            raise Conflict(f"{m.name} v{v.number} is {v.status}, not yanked")
        records = queries.mirrors(session, v)
        # any record, not only done ones: a mirror that failed late (at its tag) may have
        # committed the version to the hub's index already
        return _Yanked(m.name, v.number, v.id, v.yank_reason or "yanked",
                       [f"{r.target}:{r.repo}" for r in records if r.status == "done"],
                       {_repo_key(f"{r.target}:{r.repo}", strict=False) for r in records})


def _never_mirrored(kind: str, repo: str, model: str, number: int) -> MirrorResult:
    return MirrorResult(kind, repo, "skipped", note=(
        f"{model} v{number} was never mirrored to {kind}:{repo} (no record of it there: "
        f"`oscar-zoo mirror {model}@{number} --status`), so there is no yank to record; "
        "being yanked, it is not mirrored anywhere new"))


def mirror_yank_in_background(registry, model: str, number: int) -> threading.Thread:
    """mirror_yank in a background thread: a yank never waits on a hub."""
    return _in_background(f"mirror-yank-{model}-v{number}",
                          f"recording the yank of {model} v{number} on its mirrors",
                          mirror_yank, registry, model, number)


def _in_background(name: str, what: str, fn, *args) -> threading.Thread:
    """fn(*args) in a daemon thread; a failure is logged (the mirror records say the rest)."""
    def run():
        try:
            fn(*args)
        except Exception:  # a background job: nobody to raise to
            log.exception("%s failed", what)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _repo_lock(registry, kind: str, repo: str):
    """One mirror run per hub repo at a time on this registry host: ModelScope has no
    parent-commit check, so two runs could each rewrite the index without the other's entry."""
    from filelock import FileLock

    path = Path(registry.data_dir) / "locks" / f"mirror-{kind}-{repo.replace('/', '--')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), timeout=max(float(settings.get("lock_timeout")), 600.0))


def mirror_after_publish(registry, publication, wait: bool = False) -> threading.Thread | None:
    """Mirror a freshly published version in the background (publishing never waits on a
    hub). Call it after `Registry.publish`; see `mirror_published`."""
    if publication.version.status != "published":
        return None
    with registry.db.read() as session:   # the publication's row is detached by now
        version = session.get(BundleVersion, publication.version.id)
        model, number = version.model.name, version.number
    return mirror_published(registry, model, number, wait)


def mirror_published(registry, model: str, number: int,
                     wait: bool = False) -> threading.Thread | None:
    """Mirror a published version, in a background thread, to its model's configured targets
    plus those its calibration job's spec asked for that the configuration allows (see
    `job_targets`). Returns the thread, or None when the version is not published or there
    is nowhere to mirror it."""
    with registry.db.read() as session:
        m = queries.resolve_model(session, model)
        v = queries.resolve_version(session, m, number)
        if v.status != "published":
            return None
        job = session.get(Job, v.source_job) if v.source_job else None
        asked = list((job.spec or {}).get("mirror") or []) if job is not None else []
        model, number, version_id = m.name, v.number, v.id
    if not asked and not settings.get("mirror_targets"):
        return None
    thread = _in_background(f"mirror-{model}-v{number}", f"mirroring {model} v{number}",
                            _mirror_job_version, registry, model, number, version_id, asked)
    if wait:
        thread.join()
    return thread


def job_targets(model: str, asked: list[str]) -> tuple[list[str], list[str]]:
    """(targets, refused): the model's configured targets, plus those a job spec asked for
    that OSCAR_ZOO_MIRROR_TARGETS names (for any model); the rest are refused. The push uses
    the server's hub tokens, so whoever may submit a job must not choose where they write."""
    allowed = {_repo_key(item.partition("=")[2] if "=" in item else item)
               for item in settings.get("mirror_targets") or []}
    extra, refused = [], []
    for target in dict.fromkeys(t.strip() for t in asked):
        (extra if _repo_key(target, strict=False) in allowed else refused).append(target)
    return list(dict.fromkeys([*configured_targets(model), *extra])), refused


def _repo_key(target: str, strict: bool = True) -> tuple[str, str] | None:
    try:
        kind, repo = parse_target(target)
    except ConfigError:
        if strict:
            raise
        return None
    return kind, repo.lower()   # hub repo ids are case-insensitive


def _mirror_job_version(registry, model: str, number: int, version_id: int,
                        asked: list[str]) -> None:
    # in the background thread, the targets too: a bad OSCAR_ZOO_MIRROR_TARGETS must not fail
    # the publish or job that called us
    targets, refused = job_targets(model, asked)
    for target in refused:
        _record_refused(registry, version_id, target, model, number)
    if targets:
        mirror_version(registry, model, number, targets)


def _record_refused(registry, version_id: int, target: str, model: str, number: int) -> None:
    why = (f"not mirrored: {target} is not one of the server's mirror targets "
           "(OSCAR_ZOO_MIRROR_TARGETS), and a job may only ask for those; ask the registry's "
           f"operator to add it, or run `oscar-zoo mirror {model}@{number} --to {target}`")
    log.warning("%s v%s: %s", model, number, why)
    try:
        kind, repo = parse_target(target)
    except ConfigError:
        return
    with registry.db.write() as session:
        record_mirror(session, version_id, kind, repo, "failed", error=why)


def _link_or_copy(src: Path, dest: Path) -> None:
    import os
    import shutil

    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
