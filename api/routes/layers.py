"""The layer index: one layer's (or one KV head's) rotation, clip and eigenvalues, as JSON or
raw bytes, and a range of layers as a safetensors file (a pipeline-parallel rank fetches its own).

Everything is cut out of the stored rotations.safetensors by byte range; nothing else is loaded.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session

from ...registry_db import queries
from ...registry_db.tensors import TensorSpan, build_header, head_span, read_spans
from ...zoo.errors import InvalidInput, LayerNotFound
from ...zoo.files import sha256_bytes
from ...zoo.manifest import TENSORS
from .. import serialize
from ..deps import reading
from ..ranges import etag_matches
from ..schemas import LayerIndexList

router = APIRouter(tags=["layers"])
KINDS = ("rotation", "clip", "eigenvalues", "mean")
MAX_LAYER = 100_000
Side = Literal["k", "v"]


@functools.lru_cache(maxsize=256)
def _spans(path: str) -> dict[str, TensorSpan]:
    return read_spans(path)  # blobs are immutable: a header read once stays right


def _tensor_file(request: Request, version) -> tuple[Path, dict[str, TensorSpan]]:
    entry = next(f for f in version.files if f.name == TENSORS)
    path = request.app.state.registry.blobs.verified_path(entry.sha256)
    return path, _spans(str(path))


def _read(path: Path, span: TensorSpan) -> np.ndarray:
    with open(path, "rb") as f:
        f.seek(span.start)
        data = f.read(span.nbytes)
    return np.frombuffer(data, dtype="<f4").reshape(span.shape)  # bundles are float32 only


def _lookup(session: Session, name: str, ref: str):
    model = queries.resolve_model(session, name)
    return model, queries.resolve_version(session, model, ref)


@router.get("/v1/models/{name:path}/versions/{ref}/layers", response_model=LayerIndexList,
            summary="The index: every (layer, side, KV head) with its byte range, clip, eigenvalues")
def layer_index(name: str, ref: str, request: Request):
    with reading(request) as session:
        model, version = _lookup(session, name, ref)
        rows = queries.index_rows(session, version)
        return {"model": model.name, "version": version.number,
                "granularity": version.method.get("granularity", "layer"),
                "items": [serialize.head_index(r) for r in rows]}


@router.get("/v1/models/{name:path}/versions/{ref}/layers/{layer}",
            summary="One layer (or one KV head) of a version, as JSON or raw float32 bytes",
            responses={200: {"content": {"application/json": {},
                                         "application/octet-stream": {}}}})
def layer(name: str, ref: str, layer: int, request: Request,
          side: Side | None = Query(None, description="k or v; both when absent (JSON only)"),
          head: int | None = Query(None, ge=0, le=4096, description="one KV head"),
          format: Literal["json", "raw"] = Query("json", description="raw: the rotation's "
                                                 "little-endian float32 bytes, shape in X-Tensor-Shape")):
    if not 0 <= layer <= MAX_LAYER:
        raise LayerNotFound(f"layer {layer} is out of range")
    with reading(request) as session:
        model, version = _lookup(session, name, ref)
        rows = queries.layer_rows(session, version, layer, side, head)
    per_head = version.method.get("granularity") == "kv_head"
    path, spans = _tensor_file(request, version)
    if format == "raw":
        if side is None:
            raise InvalidInput("format=raw returns one tensor: pass side=k or side=v")
        span = spans[f"{side}.{layer}.rotation"]
        if head is not None and per_head:
            span = head_span(span, head)
        return _raw(request, path, span, version.digest, head)
    sides = {}
    for s in sorted({r.side for r in rows}):
        sides[s] = _side_json(path, spans, s, layer, head, per_head,
                              [r for r in rows if r.side == s])
    # Plain floats: JSONResponse skips FastAPI's per-element jsonable_encoder walk.
    return JSONResponse({"model": model.name, "version": version.number,
                         "digest": version.digest, "layer": layer, "kv_head": head,
                         "granularity": version.method.get("granularity", "layer"),
                         "sides": sides})


def _side_json(path: Path, spans: dict[str, TensorSpan], side: str, layer: int,
               head: int | None, per_head: bool, rows) -> dict:
    out: dict = {"heads": [serialize.head_index(r) for r in rows]}
    for kind in KINDS:
        span = spans.get(f"{side}.{layer}.{kind}")
        if span is None:
            out[kind] = None
            continue
        arr = _read(path, span)
        # clip and mean are stacked per head always; rotation and eigenvalues in per-head bundles.
        if head is not None and (kind in ("clip", "mean") or (kind == "rotation" and per_head)
                                 or (kind == "eigenvalues" and arr.ndim == 2)):
            arr = arr[head]
        out[kind] = arr.tolist()
    out["tensor"] = f"{side}.{layer}.rotation"
    return out


def _raw(request: Request, path: Path, span: TensorSpan, digest: str, head: int | None) -> Response:
    etag = f'"{digest}-{span.name}"'
    headers = {"ETag": etag, "X-Tensor-Name": span.name, "X-Tensor-Dtype": "float32-le",
               "X-Tensor-Shape": ",".join(map(str, span.shape)),
               "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    with open(path, "rb") as f:
        f.seek(span.start)
        data = f.read(span.nbytes)
    return Response(data, media_type="application/octet-stream", headers=headers)


# --- a range of layers as one safetensors file -----------------------------------------------

def parse_layers(spec: str, available: list[int]) -> list[int]:
    """`0-45,60` -> the listed layers the version has. A range keeps the layers it covers
    (hybrid models have gaps); a single layer must exist.

    Raises InvalidInput for a malformed spec, LayerNotFound for a missing single layer.
    """
    have, chosen = set(available), set()
    for item in spec.split(","):
        item = item.strip()
        lo, _, hi = item.partition("-")
        # isascii: str.isdigit() also passes digits int() refuses (a 500) or reads ('٣' is 3).
        if (not (lo + hi).isascii() or not lo.isdigit() or (hi and not hi.isdigit())
                or (_ and not hi)):
            raise InvalidInput(f"bad layer spec {item!r}: use numbers and ranges like 0-45,60")
        a, b = int(lo), int(hi) if hi else int(lo)
        if a > b:
            raise InvalidInput(f"bad layer range {item!r}: start must not exceed end")
        if b > MAX_LAYER:
            raise InvalidInput(f"bad layer range {item!r}: layer numbers go up to {MAX_LAYER}; "
                               f"this version's layers are {available[0]} to {available[-1]}")
        if not hi and a not in have:
            raise LayerNotFound(f"this version has no layer {a}")
        chosen |= {i for i in available if a <= i <= b}
    if not chosen:
        raise LayerNotFound(f"no layers of this version in {spec!r}; it has {len(available)} "
                            f"layers from {available[0]} to {available[-1]}")
    return sorted(chosen)


@router.get("/v1/models/{name:path}/versions/{ref}/layers.safetensors",
            summary="A range of layers as a safetensors file (e.g. layers=0-45,60)",
            responses={200: {"content": {"application/octet-stream": {}}}})
def layers_file(name: str, ref: str, request: Request,
                layers: str = Query(..., min_length=1, max_length=1000,
                                    description="layers and ranges: 0-45,60"),
                side: Side | None = Query(None, description="only k or only v")):
    with reading(request) as session:
        model, version = _lookup(session, name, ref)
        chosen = parse_layers(layers, queries.indexed_layers(session, version))
    path, spans = _tensor_file(request, version)
    picked = [spans[k] for layer in chosen for s in ("k", "v") if side in (None, s)
              for kind in KINDS if (k := f"{s}.{layer}.{kind}") in spans]
    meta = {"format": "oscar-zoo.bundle", "model": model.name, "version": str(version.number),
            "digest": version.digest, "layers": ",".join(map(str, chosen))}
    header = build_header(picked, meta)
    etag = f'"{sha256_bytes(header)}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache",
               "Content-Length": str(len(header) + sum(s.nbytes for s in picked)),
               "Content-Disposition": f'attachment; filename="{model.name}-v{version.number}-'
                                      f'layers-{chosen[0]}-{chosen[-1]}.safetensors"'}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers={"ETag": etag})
    return StreamingResponse(_stream(path, header, picked), headers=headers,
                             media_type="application/octet-stream")


def _stream(path: Path, header: bytes, spans: list[TensorSpan]) -> Iterator[bytes]:
    yield header
    with open(path, "rb") as f:
        for span in spans:
            f.seek(span.start)
            yield f.read(span.nbytes)
