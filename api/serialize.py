"""ORM rows -> the JSON bodies of api/schemas.py. Times are UTC ISO 8601 with a Z."""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import quote

from ..registry_db.models import Alias, BundleVersion, LayerIndex, MirrorRecord, Model
from ..zoo.errors import public_line


def iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Room for the registry's words around a worker's line ("attempt 2 failed and will be retried:
# ...", "... (after 3 attempts)"): only what no current worker sends is cut again on the way out
_FRAMED_CAP = 1000


def public_error(error: str | None) -> str | None:
    """A job's error as anyone may read it: its first line, as workers now store it. Jobs that
    failed before stored the runner's traceback, or the end of its output, after that line;
    both name the worker host's paths and code."""
    if not error:
        return error
    return public_line(error, cap=_FRAMED_CAP)


def model_item(m: Model, stats: dict) -> dict:
    return {"name": m.name, "hub_id": m.hub_id, "architecture": m.architecture,
            "aliases": list(m.aliases or []), "geometry": m.geometry,
            "geometry_verified": m.geometry_verified, "source": m.source, **stats}


def version_summary(v: BundleVersion, aliases: list[str]) -> dict:
    return {"version": v.number, "status": v.status, "yank_reason": v.yank_reason,
            "digest": v.digest, "size": v.size, "granularity": v.method.get("granularity", "layer"),
            "key_centering": bool(v.method.get("key_centering")), "clip": v.clip,
            "validation_passed": v.validation_passed, "aliases": aliases,
            "created_at": iso(v.created_at), "created_by": v.created_by,
            "source_job": v.source_job}


def file_url(model: str, number: int, name: str) -> str:
    return f"/v1/models/{model}/versions/{number}/files/{quote(name)}"


def version_detail(v: BundleVersion, aliases: list[str]) -> dict:
    model = v.model
    return {"model": model.name, "hub_id": model.hub_id, "version": v.number, "status": v.status,
            "yank_reason": v.yank_reason, "yanked_at": iso(v.yanked_at), "digest": v.digest,
            "size": v.size, "manifest": v.manifest, "validation": v.validation,
            "files": [{"name": f.name, "sha256": f.sha256, "size": f.size,
                       "url": file_url(model.name, v.number, f.name)} for f in v.files],
            "aliases": aliases, "created_at": iso(v.created_at), "created_by": v.created_by,
            "source_job": v.source_job}


def alias_info(a: Alias) -> dict:
    return {"alias": a.name, "version": a.version.number, "updated_at": iso(a.updated_at),
            "updated_by": a.updated_by}


def alias_event(e, from_number: int | None, to_number: int | None) -> dict:
    return {"alias": e.alias, "from_version": from_number, "to_version": to_number,
            "at": iso(e.at), "by": e.by, "reason": e.reason}


def mirror(r: MirrorRecord) -> dict:
    return {"target": r.target, "repo": r.repo, "path": r.path, "revision": r.revision,
            "url": r.url, "status": r.status, "error": r.error,
            "created_at": iso(r.created_at), "updated_at": iso(r.updated_at)}


def head_index(r: LayerIndex) -> dict:
    return {"layer": r.layer, "side": r.side, "kv_head": r.kv_head, "tensor": r.tensor_key,
            "byte_range": [r.byte_start, r.byte_end], "clip": r.clip, "eig_min": r.eig_min,
            "eig_max": r.eig_max, "eig_mean": r.eig_mean}
