"""Publish a bundle directory as a new immutable version, and change a version's status.

Order of work, for crash safety: verify everything (no side effects), then write the blobs
(atomic, content-addressed), then one database transaction. A rejected bundle leaves nothing;
a crash between blobs and commit leaves only unreferenced blobs (BlobStore.collect_garbage).

Concurrency: the model row is locked FOR UPDATE (PostgreSQL; SQLite has one writer anyway),
and unique (model_id, number) and (model_id, digest) back that up: a loser retries, so 32
concurrent publishers get 32 distinct numbers, and the same content twice gets one version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlalchemy.orm import Session

from ..zoo.bundle import require_whole, verify_bundle
from ..zoo.catalog import MODEL_NAME, PLAIN_NAME_RULE, is_hub_id
from ..zoo.errors import BundleFormatError, Conflict, InvalidInput, ModelNotFound, YankedVersion
from ..zoo.files import sha256_bytes
from ..zoo.geometry import ModelGeometry
from ..zoo.manifest import MANIFEST, TENSORS, FileEntry, Manifest, verdict_disagreement
from . import audit
from .aliases import LATEST, lock_model, move_alias, refresh_latest
from .blobs import BlobStore
from .models import BundleVersion, LayerIndex, Model, VersionFile, extra_loss
from .queries import aliases_of, resolve_model
from .tensors import head_span, read_spans

RETRIES = 64
ARCHITECTURE_MAX = 200


@dataclass
class Prepared:
    """A verified bundle, ready to store: nothing has been written anywhere yet."""

    path: Path
    manifest: Manifest
    manifest_bytes: bytes          # canonical bundle.json; its sha256 is the digest
    digest: str
    files: list[FileEntry]         # bundle.json first, then the manifest's files
    index: list[dict]              # LayerIndex rows without version_id

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class Publication:
    version: BundleVersion
    created: bool                  # False: the same content was already a version


def prepare_bundle(bundle_dir: str | Path) -> Prepared:
    """Every check of `oscar-zoo inspect` (names, shapes, dtypes, finiteness, orthogonality,
    sha256 and size of each file) plus the layer index.

    Raises BundleFormatError (also for a --layers part: only whole bundles are published) or
    IntegrityError; writes nothing.
    """
    path = Path(bundle_dir)
    require_whole(path)
    manifest = verify_bundle(path)
    check_verdict(manifest)
    raw = manifest.to_json().encode()
    digest = sha256_bytes(raw)
    files = [FileEntry(name=MANIFEST, sha256=digest, size=len(raw)), *manifest.files]
    return Prepared(path, manifest, raw, digest, files, _index(manifest, path / TENSORS))


def check_verdict(manifest: Manifest) -> None:
    """BundleFormatError when the validation report's `passed` contradicts its own numbers
    (zoo.manifest.verdict_disagreement): the stored verdict decides draft or published, and
    what `show` and the pages tell users, so it is re-derived, not taken on trust."""
    report = manifest.validation
    why = verdict_disagreement(report) if report is not None else None
    if why:
        raise BundleFormatError(
            f"{MANIFEST}'s validation report contradicts itself: {why}. Its verdict must "
            "follow from its numbers: run `oscar-zoo validate` on the bundle again (it rewrites "
            "the report; a bundle in the cache, validate a copy) rather than editing `passed`")


def default_status(manifest: Manifest) -> str:
    """A publish that names no status: a bundle whose validation failed is kept as a draft,
    as a calibration job keeps it (docs/jobs.md), so it never becomes `latest` unasked; ask
    for status=published to publish it anyway. Without a report (RotationZoo imports, jobs
    run without validation) nothing says it failed: published, as before."""
    report = manifest.validation
    return "draft" if report is not None and not report.passed else "published"


def _index(manifest: Manifest, tensors_path: Path) -> list[dict]:
    spans = read_spans(tensors_path)
    tensors = load_file(str(tensors_path))
    per_head = manifest.method.granularity == "kv_head"
    rows = []
    for key, span in spans.items():
        side, layer, kind = key.split(".")
        if kind != "rotation":
            continue
        clip = tensors[f"{side}.{layer}.clip"]                       # [h]
        eig = tensors.get(f"{side}.{layer}.eigenvalues")             # [d] or [h, d]
        for h in range(clip.shape[0]):
            head_bytes = head_span(span, h) if per_head else span
            e = None if eig is None else (eig[h] if eig.ndim == 2 else eig)
            rows.append(dict(layer=int(layer), kv_head=h, side=side, tensor_key=key,
                             byte_start=head_bytes.start, byte_end=head_bytes.end,
                             clip=float(clip[h]), **_eig_summary(e)))
    return rows


def _eig_summary(e: np.ndarray | None) -> dict:
    if e is None:
        return dict(eig_min=None, eig_max=None, eig_mean=None)
    return dict(eig_min=float(e.min()), eig_max=float(e.max()), eig_mean=float(e.mean()))


def model_for(session: Session, manifest: Manifest, name: str | None = None,
              create: bool = True, created_by: str | None = None) -> Model | None:
    """The model row a bundle belongs to; a model no one knows yet is created from the bundle
    (with create=False: only checked, and None returned where it would be created).

    `name` (the API path) must name the same model as the manifest. Raises InvalidInput on a
    mismatch, BundleFormatError when the geometry contradicts the model's.
    """
    ref = manifest.model
    model = known_model(session, ref.name, ref.hub_id)
    if name is not None:
        asked = _resolve_or_none(session, name)
        new_model = model is None and asked is None and name.strip().lower() in (
            ref.name.lower(), ref.hub_id.lower(), ref.hub_id.lower().replace("/", "--"))
        if not new_model and (model is None or asked is None or asked.id != model.id):
            # the registry's name for the bundle's model (known by its hub id under another name)
            target = model.name if model is not None else ref.name
            err = InvalidInput(f"this bundle is for {ref.name} ({ref.hub_id}), not {name!r}; "
                               f"upload it to /v1/models/{target}/versions")
            # the model to post it under, for a client to give its own fix (the CLI's --name)
            # without parsing the detail, whose fix is for whoever calls the API by hand
            err.extensions = {"bundle_model": target}
            raise err
    if model is None:
        _check_new_model(manifest)
        if not create:
            return None
        model = _create_model(session, manifest, created_by)
        if model is None:
            return _created_concurrently(session, manifest, name)
        return model
    clash = hub_id_clash(model, ref.hub_id)
    if clash:
        raise InvalidInput(f"the bundle names model {ref.name!r} with hub id {ref.hub_id!r}, but "
                           f"{clash}; fix bundle.json")
    check_geometry(model, manifest)
    return model


def known_model(session: Session, name: str, hub_id: str) -> Model | None:
    """The model row a bundle of model `name` with `hub_id` goes to (by its name first, else by
    its hub id), or None for a model no one knows yet. Check it with hub_id_clash."""
    return _resolve_or_none(session, name) or _resolve_or_none(session, hub_id)


def hub_id_clash(model: Model | None, hub_id: str) -> str | None:
    """Why a bundle for `hub_id` cannot go under `model` (known_model's row), or None. One
    registry name is one hub model: model_for refuses a clash at upload, and a job submit
    refuses it before the calibration (api/routes/jobs.py) rather than at its result."""
    if model is None or hub_id.lower() == model.hub_id_lower:
        return None
    return f"the registry knows {model.name} as {model.hub_id}"


def _resolve_or_none(session: Session, name: str) -> Model | None:
    try:
        return resolve_model(session, name)
    except ModelNotFound:
        return None


def _check_new_model(manifest: Manifest) -> None:
    ref = manifest.model
    if not MODEL_NAME.fullmatch(ref.name.lower()) or not is_hub_id(ref.hub_id):
        raise InvalidInput(f"a new model needs a plain name ({PLAIN_NAME_RULE}) and a hub id "
                           f"like org/repo; got {ref.name!r} and {ref.hub_id!r}")
    if "--" in ref.name:    # `org--repo` is how URLs spell the hub id org/repo
        raise InvalidInput(f"model name {ref.name!r}: '--' is reserved (a URL's `org--repo` names "
                           "the hub id org/repo); pick a name without it")
    # stored in the model's row (models.architecture, String(200)); PostgreSQL refuses longer
    # text and NUL, so the upload failed only at the insert, after its blobs were written
    arch = ref.architecture or ""
    if len(arch) > ARCHITECTURE_MAX or "\x00" in arch:
        raise InvalidInput(f"model.architecture must be at most {ARCHITECTURE_MAX} characters, "
                           f"without NUL (got {len(arch)} characters); use the class name from "
                           "the model's config.json, e.g. Qwen3ForCausalLM")


def _create_model(session: Session, manifest: Manifest, created_by: str | None) -> Model | None:
    """The new model row, or None when a concurrent upload created it (or its hub id) first."""
    ref = manifest.model
    values = dict(name=ref.name.lower(), hub_id=ref.hub_id, hub_id_lower=ref.hub_id.lower(),
                  architecture=ref.architecture, aliases=[],
                  geometry=manifest.geometry.to_geometry().to_dict(), source="upload")
    try:
        with session.begin_nested():
            model = Model(**values)
            session.add(model)
    except DBIntegrityError:
        return None
    audit.record(session, created_by, "model.create", model.name, hub_id=model.hub_id)
    return model


def _created_concurrently(session: Session, manifest: Manifest, name: str | None) -> Model:
    # The winner's bundle may name another hub id or geometry than ours: check ours against
    # its row exactly as if it had been there first (PostgreSQL; SQLite has one writer).
    model = model_for(session, manifest, name, create=False)
    if model is None:
        ref = manifest.model
        raise Conflict(f"another upload created a model clashing with {ref.name} ({ref.hub_id}) "
                       "at the same moment; retry the upload")
    return model


def check_geometry(model: Model, manifest: Manifest) -> None:
    """Catalog models with verified geometry, and models created by upload, must match exactly."""
    if not (model.geometry_verified or model.source == "upload"):
        return
    want = ModelGeometry.from_dict(model.geometry).to_dict()
    got = manifest.geometry.to_geometry().to_dict()
    diff = [f"{k} {got[k]} (model has {want[k]})" for k in want if got.get(k) != want[k]]
    if diff:
        raise BundleFormatError(f"bundle geometry does not match {model.name}: {'; '.join(diff)}")


def store_blobs(blobs: BlobStore, prepared: Prepared) -> None:
    """Write every file as a verified, content-addressed blob (atomic; idempotent)."""
    blobs.put_bytes(prepared.manifest_bytes)
    for f in prepared.manifest.files:
        blobs.put_file(prepared.path / f.name, f.sha256, f.size)


def record_version(session: Session, model: Model, prepared: Prepared, created_by: str | None,
                   source_job: str | None = None, status: str | None = None) -> Publication:
    """Insert the version, its files and index rows in the caller's transaction. `status`
    None: by the bundle's validation (default_status).

    Raises YankedVersion when this content was published before and yanked.
    """
    status = status or default_status(prepared.manifest)
    if status not in ("draft", "published"):
        raise InvalidInput(f"status must be draft or published, not {status!r}")
    lock_model(session, model)
    for _ in range(RETRIES):
        existing = _by_digest(session, model, prepared.digest)
        if existing is not None and existing.status == "draft" and status == "published":
            raise Conflict(f"this bundle is {model.name} version {existing.number}, a draft; "
                           f"publish that version: oscar-zoo promote {model.name}@{existing.number}")
        if existing is not None:
            return Publication(existing, False)
        number = (session.scalar(select(func.max(BundleVersion.number))
                                 .where(BundleVersion.model_id == model.id)) or 0) + 1
        try:
            with session.begin_nested():
                version = _insert(session, model, prepared, number, created_by, source_job, status)
        except DBIntegrityError:
            continue  # another writer took this number or this digest: look again
        if status == "published":
            refresh_latest(session, model, created_by, f"published version {number}")
        audit.record(session, created_by, "version.create", f"{model.name}/{number}",
                     digest=prepared.digest, status=status, source_job=source_job)
        return Publication(version, True)
    raise Conflict(f"could not allocate a version number for {model.name} after {RETRIES} tries; "
                   "retry the upload")


def _by_digest(session: Session, model: Model, digest: str) -> BundleVersion | None:
    existing = session.scalar(select(BundleVersion).where(BundleVersion.model_id == model.id,
                                                          BundleVersion.digest == digest))
    if existing is not None and existing.status == "yanked":
        raise YankedVersion(f"this bundle is {model.name} version {existing.number}, yanked: "
                            f"{existing.yank_reason}; it will not be published again")
    return existing


def _insert(session: Session, model: Model, p: Prepared, number: int, created_by: str | None,
            source_job: str | None, status: str) -> BundleVersion:
    m = p.manifest
    validation = m.validation.model_dump(mode="json") if m.validation else None
    version = BundleVersion(
        model_id=model.id, number=number, status=status, digest=p.digest, size=p.size,
        method=m.method.model_dump(mode="json"), quantization=m.quantization.model_dump(mode="json"),
        clip=m.clip.model_dump(mode="json"), calibration=m.calibration.model_dump(mode="json"),
        validation=validation, validation_passed=m.validation.passed if m.validation else None,
        extra_loss=extra_loss(validation),
        manifest=m.model_dump(mode="json"), created_by=created_by, source_job=source_job)
    session.add(version)
    session.flush()
    session.add_all(VersionFile(version_id=version.id, name=f.name, sha256=f.sha256, size=f.size)
                    for f in p.files)
    session.execute(insert(LayerIndex), [dict(r, version_id=version.id) for r in p.index])
    session.flush()
    return version


def publish_bundle(session: Session, blobs: BlobStore, bundle_dir: str | Path,
                   created_by: str | None = None, source_job: str | None = None,
                   status: str | None = None, model_name: str | None = None) -> Publication:
    """Verify, store and record a bundle directory in the caller's transaction (`status`
    None: published, or a draft when its validation failed; see default_status).

    Use inside `Database.write()` (it commits); the job runner calls this after calibrating.
    Raises BundleFormatError, IntegrityError, InvalidInput, YankedVersion.
    """
    prepared = prepare_bundle(bundle_dir)
    model = model_for(session, prepared.manifest, model_name, created_by=created_by)
    store_blobs(blobs, prepared)
    return record_version(session, model, prepared, created_by, source_job, status)


# --- status changes --------------------------------------------------------------------------

def yank_version(session: Session, version: BundleVersion, reason: str, by: str | None) -> None:
    """Yank (never delete). Raises InvalidInput without a reason, Conflict if already yanked."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a yank needs a reason (users see it when they pull this version)")
    _lock(session, version)
    if version.status == "yanked":
        raise Conflict(f"version {version.number} is already yanked: {version.yank_reason}")
    version.status, version.yank_reason = "yanked", reason
    version.yanked_at = datetime.now(timezone.utc)
    audit.record(session, by, "version.yank", f"{version.model.name}/{version.number}", reason=reason)
    session.flush()
    # aliases name published versions only: `recommended` left on a yanked version would be
    # what a bare pull and the model page still offer. The history keeps where each pointed.
    why = f"version {version.number} yanked: {reason}"
    lock_model(session, version.model)      # before reading which aliases point here
    for name in aliases_of(session, [version.id])[version.id]:
        if name != LATEST:
            move_alias(session, version.model, name, None, by, why)
    refresh_latest(session, version.model, by, f"version {version.number} yanked")


def promote_draft(session: Session, version: BundleVersion, by: str | None) -> None:
    """draft -> published. Raises Conflict for any other status."""
    _lock(session, version)
    if version.status != "draft":
        raise Conflict(f"version {version.number} is {version.status}, not a draft")
    version.status = "published"
    audit.record(session, by, "version.publish", f"{version.model.name}/{version.number}")
    session.flush()
    refresh_latest(session, version.model, by, f"published version {version.number}")


def _lock(session: Session, version: BundleVersion) -> None:
    # The status was read without a lock: a concurrent yank or promote may have committed
    # since, and checking the stale value would write over it (a yanked version live again).
    # NO KEY UPDATE: a publish's alias event references this row (a KEY SHARE lock) while it
    # holds the model lock that refresh_latest waits for; FOR UPDATE would deadlock with it.
    session.execute(select(BundleVersion.id).where(BundleVersion.id == version.id)
                    .with_for_update(key_share=True))
    session.refresh(version)
