"""Download a version's files by name: ETag (= sha256), HEAD, Range, If-None-Match.

A bundle may carry files of any name, uploaded by any publisher: only the bundle's own kinds get
a content type, everything else is an attachment of opaque bytes, never HTML or SVG that a
browser would run on the registry's origin.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request

from ...registry_db import queries
from ...zoo.errors import FileNotInBundle, StorageCorrupt
from ..deps import reading
from ..ranges import file_response

router = APIRouter(tags=["files"])
MEDIA = {".json": "application/json", ".md": "text/markdown; charset=utf-8",
         ".safetensors": "application/octet-stream"}


FILE_PATH = "/v1/models/{name:path}/versions/{ref}/files/{filename}"
RESPONSES = {200: {"content": {"application/octet-stream": {}}},
             206: {"description": "Partial content (Range)"},
             304: {"description": "Not modified (If-None-Match)"}}


@router.head(FILE_PATH, operation_id="head_file", summary="Size and ETag of one file",
             responses=RESPONSES)
@router.get(FILE_PATH, operation_id="download_file", summary="Download one file of a version",
            responses=RESPONSES)
def download(name: str, ref: str, filename: str, request: Request):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, ref)
        entry = next((f for f in version.files if f.name == filename), None)
        if entry is None:
            names = ", ".join(f.name for f in version.files)
            raise FileNotInBundle(f"version {version.number} of {model.name} has no file "
                                  f"{filename!r}; its files are {names}")
        path = _blob(request, model.name, version.number, entry)
        suffix = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
        media = MEDIA.get(suffix)
        return file_response(request, path, entry.size, entry.sha256,
                             media or "application/octet-stream",
                             immutable=queries.names_a_number(ref),
                             filename=None if media else filename)


def _blob(request: Request, model: str, number: int, entry) -> Path:
    """The verified blob of a version's file. A blob missing or corrupt is named by model,
    version and file in the answer (problem members `model`, `version`, `file`), which the
    operator who must restore it goes by; the blob's hash alone named nothing they know."""
    try:
        return request.app.state.registry.blobs.verified_path(
            entry.sha256, of=f"file {entry.name!r} of {model} version {number}")
    except StorageCorrupt as e:
        e.extensions = {"model": model, "version": number, "file": entry.name}
        raise
