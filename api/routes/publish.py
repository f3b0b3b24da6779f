"""Publish: upload a bundle's files as multipart/form-data -> a new immutable version.

    curl -H "Authorization: Bearer $TOKEN" \
         -F bundle.json=@b/bundle.json -F rotations.safetensors=@b/rotations.safetensors \
         -F README.md=@b/README.md  $REGISTRY/v1/models/qwen3-8b/versions

Each file part is named after the bundle file (or sent as field `files` with that file name).
The upload is staged in the data dir and verified like `oscar-zoo inspect` before anything is
stored; 201 for a new version, 200 with the existing one when the same content was published.
Without a `status` field, a bundle whose validation report failed is stored as a draft (as a
calibration job keeps it), anything else published; `status=published` publishes it anyway. A
report whose `passed` contradicts its own numbers is refused (422).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect

from ...registry_db.blobs import FREE_SPACE
from ...registry_db.mirrors import mirror_after_publish
from ...registry_db.models import BundleVersion
from ...zoo.errors import InvalidInput, OscarZooError, UnsafePathError, UnsupportedMediaType
from ...zoo.files import CHUNK, out_of_space, safe_join
from ...zoo.manifest import MANIFEST
from ..auth import Caller, caller
from ..schemas import VersionDetail
from .versions import version_body

router = APIRouter(tags=["publish"])
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_FILES = 16
FIELDS = {"status": ("draft", "published"), "source_job": None}

UPLOAD_SCHEMA = {
    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["bundle.json"],
        "properties": {
            "bundle.json": {"type": "string", "format": "binary"},
            "rotations.safetensors": {"type": "string", "format": "binary"},
            "README.md": {"type": "string", "format": "binary"},
            "status": {"type": "string", "enum": ["draft", "published"],
                       "description": "default: published, or draft for a bundle whose "
                                      "validation report failed"},
            "source_job": {"type": "string", "maxLength": 200},
        }}}}},
}


@router.post("/v1/models/{name:path}/versions", status_code=201, response_model=VersionDetail,
             summary="Publish a bundle (multipart upload of its files)",
             openapi_extra=UPLOAD_SCHEMA,
             responses={200: {"model": VersionDetail,
                               "description": "the same content was already this version"}})
async def publish(name: str, request: Request, who: Caller = Depends(caller("bundles:publish"))):
    registry = request.app.state.registry
    async with staged_upload(request, "upload-", "the bundle upload") as (staging, fields):
        pub = await run_in_threadpool(
            registry.publish, staging, who.actor, fields.get("source_job") or None,
            fields.get("status") or None, name, who.token_id)
    if pub.created:  # to the configured hub mirrors, in the background (never blocks publish)
        mirror_after_publish(registry, pub)
    with registry.db.read() as session:
        body = version_body(session, session.get(BundleVersion, pub.version.id))
    location = f"/v1/models/{body['model']}/versions/{body['version']}"
    return JSONResponse(body, status_code=201 if pub.created else 200,
                        headers={"Location": location})


@asynccontextmanager
async def staged_upload(request: Request, prefix: str,
                        what: str) -> AsyncIterator[tuple[Path, dict[str, str]]]:
    """The multipart body's files in a fresh staging dir under the data dir (Registry.staging),
    and its text fields; the dir is removed afterwards, whatever happened. `what` names the
    upload in the answer to a full disk (StorageFull, 507)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise UnsupportedMediaType("send the bundle files as multipart/form-data")
    form = await _receive(request, what)
    try:
        registry = request.app.state.registry
        with registry.staging(prefix) as staging:
            try:
                with out_of_space("the registry's data dir", f"staging {what}", FREE_SPACE,
                                  registry.data_dir):
                    fields = await run_in_threadpool(_stage, form, staging)
                yield staging, fields
            except OscarZooError as e:
                _without_path(e, staging)
                raise
    finally:
        await form.close()


async def _receive(request: Request, what: str):
    """The parsed multipart form; parts past 1 MB are spooled to the server's temp dir."""
    try:
        with out_of_space("the registry server's temp dir", f"receiving {what}",
                          "no version was recorded. To fix: the registry's operator frees space "
                          "there, or points TMPDIR at a larger disk; then send it again",
                          tempfile.gettempdir()):
            return await request.form(max_files=MAX_FILES, max_fields=MAX_FILES,
                                      max_part_size=64 * 1024)
    except ClientDisconnect:
        # A client gone mid-upload (a dropped link, Ctrl-C) is no server fault: nothing is staged
        # yet. Left to the catch-all, each one was logged as an unhandled error with a traceback.
        raise InvalidInput("the connection closed before the upload's end; nothing was stored: "
                           "send the bundle again") from None


def _without_path(e: OscarZooError, staging: Path) -> None:
    """The checks name files by their path; the client sent `bundle.json`, not the server's
    staging dir (which would also tell it where the data dir is)."""
    if e.args and isinstance(e.args[0], str):
        text = e.args[0].replace(f"{staging}/", "").replace(str(staging), "the upload")
        e.args = (text, *e.args[1:])


def _stage(form, staging: Path) -> dict[str, str]:
    """Write each file part into the staging dir; returns the text fields.

    Raises UnsafePathError for a name that is not a plain file name, InvalidInput otherwise.
    """
    fields: dict[str, str] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            filename = value.filename if key == "files" else key
            _check_name(filename or "")
            dest = safe_join(staging, filename)
            if dest.exists():
                raise InvalidInput(f"{filename} was sent twice")
            with open(dest, "wb") as out:
                shutil.copyfileobj(value.file, out, CHUNK)
        elif key in FIELDS:
            allowed = FIELDS[key]
            if allowed and value not in allowed:
                raise InvalidInput(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
            if len(value) > 200 or "\x00" in value:
                raise InvalidInput(f"{key} must be at most 200 characters, without NUL")
            fields[key] = value
        else:
            raise InvalidInput(f"unknown form field {key!r}: send the bundle files, plus "
                               "optional `status` (draft|published) and `source_job`")
    if not (staging / MANIFEST).is_file():
        raise InvalidInput(f"the upload has no {MANIFEST}; send every file of the bundle directory")
    return fields


def _check_name(name: str) -> None:
    if not _FILE.fullmatch(name):   # not match: `$` also matches before a final newline
        raise UnsafePathError(f"file name {name!r} is not a plain file name (letters, digits, "
                              "'.', '_', '-'; no paths); send bundle.json, rotations.safetensors "
                              "and README.md")
