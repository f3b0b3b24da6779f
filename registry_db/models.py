"""The registry schema (SQLAlchemy 2 ORM). Changed only through Alembic migrations (migrations/).

Versions are immutable once written: only `status`, `yank_reason` and `yanked_at` ever change,
and nothing is deleted. Aliases move, and every move is appended to `alias_events`.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey,
                        Index, Integer, MetaData, String, Text, TypeDecorator, UniqueConstraint,
                        text)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

STATUSES = ("draft", "published", "yanked")
SIDES = ("k", "v")
SCOPES = ("bundles:publish", "jobs:submit", "jobs:work", "admin")

# Bigint keys on PostgreSQL; SQLite autoincrements only a column declared INTEGER.
BigId = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Always timezone-aware UTC in Python; SQLite stores naive UTC, PostgreSQL timestamptz."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(timezone.utc)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    # Named constraints, so later migrations can alter them on both backends.
    metadata = MetaData(naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class Model(Base):
    """A model that bundles are made for: seeded from zoo.catalog, or created by a first upload."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)       # lower-case catalog name
    hub_id: Mapped[str] = mapped_column(String(300), unique=True)
    hub_id_lower: Mapped[str] = mapped_column(String(300), unique=True)
    architecture: Mapped[str | None] = mapped_column(String(200))
    aliases: Mapped[list[Any]] = mapped_column(default=list)         # other names, lower-case
    geometry: Mapped[dict[str, Any]]                                   # ModelGeometry.to_dict()
    geometry_verified: Mapped[bool] = mapped_column(Boolean, default=True)
    source: Mapped[str] = mapped_column(String(20), default="catalog")  # catalog | upload
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    versions: Mapped[list[BundleVersion]] = relationship(back_populates="model", lazy="raise")


class BundleVersion(Base):
    __tablename__ = "bundle_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "number"),
        UniqueConstraint("model_id", "digest"),
        CheckConstraint("status in ('draft', 'published', 'yanked')", name="status"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(10))
    yank_reason: Mapped[str | None] = mapped_column(Text)
    yanked_at: Mapped[datetime | None]
    digest: Mapped[str] = mapped_column(String(64), index=True)    # sha256 of canonical bundle.json
    size: Mapped[int] = mapped_column(BigInteger)                   # bytes of all files together
    method: Mapped[dict[str, Any]]
    quantization: Mapped[dict[str, Any]]
    clip: Mapped[dict[str, Any]]
    calibration: Mapped[dict[str, Any]]
    validation: Mapped[dict[str, Any] | None]
    validation_passed: Mapped[bool | None]
    manifest: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200))
    source_job: Mapped[str | None] = mapped_column(String(200))
    # Migration 0012: extra_loss(validation), written with the row. A copy, so that the UI's
    # lists sort and page by it in SQL: JSON paths differ between SQLite and PostgreSQL.
    extra_loss: Mapped[float | None] = mapped_column(Float)

    model: Mapped[Model] = relationship(back_populates="versions", lazy="joined")
    files: Mapped[list[VersionFile]] = relationship(order_by="VersionFile.name", lazy="selectin")


def extra_loss(validation: dict | None, variant: str = "bundle") -> float | None:
    """The extra next-token loss over BF16 (nats/token) a validation report gives `variant`:
    the number the pages show as a version's quality, and sort by. None when the report has
    none, or no finite number: NaN would have no place in an order."""
    rows = (validation or {}).get("variants")
    # the last row of that name, as the pages have always read it
    by = {r.get("name"): r for r in rows if isinstance(r, dict)} if isinstance(rows, list) else {}
    found = by.get(variant, {}).get("delta_nll")
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(found):
        return None
    return float(found)


class VersionFile(Base):
    __tablename__ = "version_files"
    __table_args__ = (UniqueConstraint("version_id", "name"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("bundle_versions.id"))
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64), index=True)     # the blob holding the bytes
    size: Mapped[int] = mapped_column(BigInteger)


class LayerIndex(Base):
    """One row per (version, layer, kv_head, side): where its rotation lies in rotations.safetensors.

    byte_start/byte_end are absolute offsets in the file, so a client can fetch one head's matrix
    with an HTTP Range request. For per-layer bundles every head points at the shared matrix.
    """

    __tablename__ = "layer_index"
    __table_args__ = (UniqueConstraint("version_id", "layer", "kv_head", "side"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("bundle_versions.id"))
    layer: Mapped[int] = mapped_column(Integer)
    kv_head: Mapped[int] = mapped_column(Integer)
    side: Mapped[str] = mapped_column(String(1))
    tensor_key: Mapped[str] = mapped_column(String(64))             # e.g. k.3.rotation
    byte_start: Mapped[int] = mapped_column(BigInteger)
    byte_end: Mapped[int] = mapped_column(BigInteger)               # exclusive
    clip: Mapped[float] = mapped_column(Float)
    eig_min: Mapped[float | None] = mapped_column(Float)
    eig_max: Mapped[float | None] = mapped_column(Float)
    eig_mean: Mapped[float | None] = mapped_column(Float)


class Alias(Base):
    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("model_id", "name"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    name: Mapped[str] = mapped_column(String(64))
    version_id: Mapped[int] = mapped_column(ForeignKey("bundle_versions.id"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[str | None] = mapped_column(String(200))

    version: Mapped[BundleVersion] = relationship(lazy="joined")


class AliasEvent(Base):
    """Append-only: every alias move, so 'what did `recommended` point at on day X' has an answer."""

    __tablename__ = "alias_events"
    __table_args__ = (Index(None, "model_id", "alias"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    alias: Mapped[str] = mapped_column(String(64))
    from_version_id: Mapped[int | None] = mapped_column(ForeignKey("bundle_versions.id"))
    to_version_id: Mapped[int | None] = mapped_column(ForeignKey("bundle_versions.id"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    by: Mapped[str | None] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)


class Job(Base):
    """A calibration job; the registry owns its state (leases, attempts, cancel). See the jobs API."""

    __tablename__ = "jobs"
    # Migration 0013: a key is the submitting token's own (registry_db/jobs.py submit)
    __table_args__ = (Index(None, "status", "created_at"),
                      UniqueConstraint("created_by_token_id", "idempotency_key"))
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20), default="queued")
    phase: Mapped[str | None] = mapped_column(String(40))
    progress: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_holder: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    result_version_id: Mapped[int | None] = mapped_column(ForeignKey("bundle_versions.id"))
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200))
    # Migration 0002 (registry_db/jobs.py owns the logic): the model's registry name for
    # filtering, GPUs the job needs, and the lease's fencing token and length. The token, as
    # task_token, is stored as its sha256 hex only (migration 0011).
    model: Mapped[str | None] = mapped_column(String(200), index=True)
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_seconds: Mapped[float] = mapped_column(Float, default=60.0)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # Migration 0004: the fields the submitting request set ({field: True, or the same for a
    # nested section}), compared with an idempotent retry's; NULL for jobs stored before.
    given_fields: Mapped[dict[str, Any] | None]
    # Migration 0005: the attached Ray task's own fencing token (lease_token stays the one its
    # dispatcher claimed with); a new task process attaching replaces it.
    task_token: Mapped[str | None] = mapped_column(String(64))
    # Migration 0007: the task processes (lease_holder names) a later task's attach replaced
    # under this claim; none of them may attach again.
    fenced_holders: Mapped[list[Any] | None]
    # Migration 0008: the token that submitted the job, by id (created_by is its name, which a
    # later token may take once it is revoked): it, or an admin token, may cancel the job. NULL
    # for jobs stored before, which only an admin token may cancel.
    created_by_token_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("api_tokens.id"))


class Worker(Base):
    """A worker the registry has heard from (registry_db/workers.py): what it can run, and when
    it last asked for work or beat for a job. Lets a queued job say why it waits."""

    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpus: Mapped[int | None] = mapped_column(Integer)     # None: a Ray dispatcher (any size)
    ray: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class MirrorRecord(Base):
    """One version mirrored to one hub repo (written by the mirror feature)."""

    __tablename__ = "mirror_records"
    __table_args__ = (UniqueConstraint("version_id", "target", "repo"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("bundle_versions.id"))
    target: Mapped[str] = mapped_column(String(20))                 # hf | modelscope
    repo: Mapped[str] = mapped_column(String(300))
    path: Mapped[str | None] = mapped_column(String(500))           # folder inside the repo
    revision: Mapped[str | None] = mapped_column(String(100))       # the hub commit
    url: Mapped[str | None] = mapped_column(String(1000))
    status: Mapped[str] = mapped_column(String(20), default="pending")  # pending | done | failed
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ApiToken(Base):
    """Only the sha256 of a token is stored; the token itself is shown once, at creation."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))                 # ozk_ + 8 chars, for humans
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None]
    # Migration 0010: past it the token is refused (registry_db/tokens.py); NULL: never expires
    expires_at: Mapped[datetime | None]

    # a live token's name is the actor of its writes: one token per name (revoked ones keep theirs)
    __table_args__ = (Index("uq_api_tokens_live_name", "name", unique=True,
                            sqlite_where=text("revoked_at IS NULL"),
                            postgresql_where=text("revoked_at IS NULL")),)


class AuditEvent(Base):
    """Every write, by whom. Append-only."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str | None] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(500))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
