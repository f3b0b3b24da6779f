"""The canonical rotation bundle: write, read and verify a bundle directory.

    bundle.json            manifest (zoo.manifest), lists every other file with sha256 and size
    rotations.safetensors  k.{layer}.rotation  [d,d] or [kv_heads,d,d]  float32
                           k.{layer}.eigenvalues [d] or [kv_heads,d]    (optional)
                           k.{layer}.clip      [kv_heads]  clip ratio per KV head (0 = off)
                           k.{layer}.mean      [kv_heads,d]  key centering (only when on)
                           v.{...} the same, never a mean
    README.md              model card with YAML front matter

Rows are right-multiplied everywhere (oscar-spec 2.7): stored key = (k - mean) @ R_k.
numpy only: the client path must not import torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save

from .errors import BundleFormatError, IntegrityError
from .files import (CACHED_PART, PARTIAL, atomic_write_bytes, publish_dir, sha256_bytes, sha256_file,
                    staging_dir)
from .manifest import CARD, MANIFEST, TENSORS, FileEntry, Manifest, parse_manifest

ORTHO_TOL = 1e-4
SIDES = ("k", "v")


@dataclass
class SideTensors:
    """One side (k or v) of one layer."""

    rotation: np.ndarray                  # [d,d] or [kv_heads,d,d]
    clip: np.ndarray                      # [kv_heads]
    eigenvalues: np.ndarray | None = None  # [d] or [kv_heads,d]
    mean: np.ndarray | None = None         # [kv_heads,d], keys only


@dataclass
class Bundle:
    manifest: Manifest
    k: dict[int, SideTensors] = field(default_factory=dict)
    v: dict[int, SideTensors] = field(default_factory=dict)
    path: Path | None = None

    def side(self, name: str) -> dict[int, SideTensors]:
        return self.k if name == "k" else self.v

    @property
    def layers(self) -> list[int]:
        return sorted(self.k)

    @property
    def digest(self) -> str:
        """Content address: sha256 of the canonical manifest, which hashes every other file."""
        return sha256_bytes(self.manifest.to_json().encode())

    def to_tensors(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for side in SIDES:
            for layer, t in sorted(self.side(side).items()):
                out[f"{side}.{layer}.rotation"] = _f32(t.rotation)
                out[f"{side}.{layer}.clip"] = _f32(t.clip)
                if t.eigenvalues is not None:
                    out[f"{side}.{layer}.eigenvalues"] = _f32(t.eigenvalues)
                if t.mean is not None:
                    out[f"{side}.{layer}.mean"] = _f32(t.mean)
        return out


def _f32(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor, without importing torch
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


# --- write -----------------------------------------------------------------------------------

def write(bundle: Bundle, out_dir: str | Path, overwrite: bool = False) -> Bundle:
    """Write atomically: everything goes to a staging dir that is renamed into place at the end.

    Raises BundleFormatError (before anything is renamed) if the bundle would not verify.
    """
    from .model_card import render_card  # card imports recipes; keep import-time small

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; remove it or pass --overwrite")
    check_tensors(bundle.manifest, bundle.to_tensors())
    with staging_dir(out_dir) as tmp:
        # fsynced (atomic_write_bytes): the directory rename alone could reach the disk before
        # the files' contents, leaving a bundle of empty files after a power loss.
        tensors = save(bundle.to_tensors(), metadata={"format": "oscar-zoo.bundle"})
        atomic_write_bytes(tmp / TENSORS, tensors)
        atomic_write_bytes(tmp / CARD, render_card(bundle.manifest).encode())
        files = [FileEntry(name=n, sha256=sha256_file(tmp / n), size=(tmp / n).stat().st_size)
                 for n in (TENSORS, CARD)]
        manifest = bundle.manifest.model_copy(update={"files": files})
        atomic_write_bytes(tmp / MANIFEST, manifest.to_json().encode())
        publish_dir(tmp, out_dir, overwrite=overwrite)
    return Bundle(manifest, bundle.k, bundle.v, out_dir)


# --- read ------------------------------------------------------------------------------------

def read_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    mfile = path / MANIFEST if path.is_dir() else path
    try:
        return parse_manifest(mfile.read_bytes(), str(mfile))
    except FileNotFoundError:
        raise BundleFormatError(f"{path} is not a bundle: no {MANIFEST} in it") from None


def read(path: str | Path, verify: bool = True) -> Bundle:
    """Load a bundle directory; with verify=True, run every check in `verify` first."""
    path = Path(path)
    manifest = verify_bundle(path) if verify else read_manifest(path)
    tensors = _load_tensors(path / TENSORS)
    bundle = Bundle(manifest, path=path)
    for name, arr in tensors.items():
        side, layer, kind = _split(name)
        entry = bundle.side(side).setdefault(layer, SideTensors(rotation=None, clip=None))
        setattr(entry, kind, arr)
    return bundle


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise BundleFormatError(f"missing {path.name} in {path.parent}") from None
    except Exception as e:  # safetensors raises its own error types for malformed headers
        raise BundleFormatError(f"{path.name} is not a valid safetensors file: {e}") from None


def _split(name: str) -> tuple[str, int, str]:
    parts = name.split(".")
    if (len(parts) != 3 or parts[0] not in SIDES or not (parts[1].isascii() and parts[1].isdigit())
            or parts[2] not in ("rotation", "clip", "eigenvalues", "mean")):
        raise BundleFormatError(
            f"unexpected tensor {name!r}: names are {{k,v}}.<layer>.{{rotation,clip,eigenvalues,mean}}")
    return parts[0], int(parts[1]), parts[2]


# --- verify ----------------------------------------------------------------------------------

def verify_bundle(path: str | Path) -> Manifest:
    """Every check a consumer relies on; raises on the first failure, returns the manifest.

    sha256 and size of each listed file; no unlisted files; the manifest schema; tensor names,
    dtypes and shapes against the geometry; finite values; orthogonal rotations; clip in [0, 1].
    """
    path = Path(path)
    manifest = read_manifest(path)
    listed = {f.name for f in manifest.files}
    for required in (TENSORS, CARD):
        if required not in listed:
            raise BundleFormatError(f"manifest does not list {required}")
    part = part_of(path)
    for f in manifest.files:
        if part is None:
            _check_file(path, f)
        elif f.name == TENSORS:     # the chosen layers only: partial.json has their hash
            have = path / f.name
            _check_file(path, FileEntry(name=f.name, sha256=part["sha256"],
                                        size=have.stat().st_size if have.is_file() else 0))
        elif (path / f.name).exists() or f.name != CARD:  # a registry part comes without a card
            _check_file(path, f)
    extra = ({p.name for p in path.iterdir() if not p.name.startswith(".")} - listed
             - {MANIFEST} - ({PARTIAL} if part is not None else set()))
    if extra:
        raise BundleFormatError(f"unlisted files in bundle: {sorted(extra)}")
    check_tensors(manifest, _load_tensors(path / TENSORS), None if part is None else part["layers"])
    return manifest


def require_whole(path: str | Path) -> None:
    """Only whole bundles are published. A --layers part passes verify_bundle, which checks its
    rotations against partial.json rather than the manifest: published, the version would list
    (and serve) a blob named by the manifest whose bytes nobody checked."""
    if any((Path(path) / marker).exists() for marker in (PARTIAL, CACHED_PART)):
        raise BundleFormatError(f"this is a --layers part of a bundle ({PARTIAL} says which "
                                f"layers), not a whole one: publish the whole bundle (pulled "
                                f"without --layers), and send no {PARTIAL}")


def part_of(path: str | Path) -> dict | None:
    """What a `--layers` output holds (partial.json, written by zoo/export.py): its layers and
    the sha256 of its rotations.safetensors; None for a whole bundle."""
    p = Path(path) / PARTIAL
    if not p.is_file():
        return None
    try:
        raw = json.loads(p.read_text())
        layers, sha = [int(i) for i in raw["layers"]], str(raw[TENSORS])
    except (ValueError, KeyError, TypeError):
        raise BundleFormatError(f"{p}: not a partial.json of oscar-zoo (layers and the sha256 of "
                                f"{TENSORS}); remove it, or pull the layers again") from None
    return {"layers": layers, "sha256": sha}


def _check_file(root: Path, entry: FileEntry) -> None:
    from .files import safe_join

    p = safe_join(root, entry.name)
    if not p.is_file():
        raise BundleFormatError(f"manifest lists {entry.name} but it is missing")
    size = p.stat().st_size
    if size != entry.size:
        raise IntegrityError(f"{entry.name}: size {size} does not match manifest ({entry.size})")
    digest = sha256_file(p)
    if digest != entry.sha256:
        raise IntegrityError(f"{entry.name}: sha256 {digest[:12]}... does not match manifest "
                             f"({entry.sha256[:12]}...); the file is corrupt or was edited")


def expected_shapes(manifest: Manifest) -> dict[str, tuple[int, ...]]:
    """Required tensor names and shapes; eigenvalues are optional and checked when present."""
    geo = manifest.geometry.to_geometry()
    per_head = manifest.method.granularity == "kv_head"
    out: dict[str, tuple[int, ...]] = {}
    for layer in geo.layers():
        d, h = geo.head_dim_of(layer), geo.kv_heads_of(layer)
        for side in SIDES:
            out[f"{side}.{layer}.rotation"] = (h, d, d) if per_head else (d, d)
            out[f"{side}.{layer}.clip"] = (h,)
        if manifest.method.key_centering:
            out[f"k.{layer}.mean"] = (h, d)
    return out


def check_tensors(manifest: Manifest, tensors: dict[str, np.ndarray],
                  layers: list[int] | None = None) -> None:
    """layers: only these are expected (a --layers part); None: every layer of the geometry."""
    want = expected_shapes(manifest)
    if layers is not None:
        want = {name: shape for name, shape in want.items() if _split(name)[1] in set(layers)}
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise BundleFormatError(f"missing tensors: {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    for name, arr in tensors.items():
        side, layer, kind = _split(name)
        if kind == "eigenvalues":
            rot = want.get(f"{side}.{layer}.rotation")
            if rot is None or arr.shape not in ((rot[-1],), rot[:-1]):
                raise BundleFormatError(f"{name}: unexpected shape {tuple(arr.shape)}")
        elif name not in want:
            raise BundleFormatError(f"unexpected tensor {name} for this geometry and method")
        elif tuple(arr.shape) != want[name]:
            raise BundleFormatError(f"{name}: shape {tuple(arr.shape)}, expected {want[name]}")
        if arr.dtype != np.float32:
            raise BundleFormatError(f"{name}: dtype {arr.dtype}, expected float32")
        if not np.isfinite(arr).all():
            raise BundleFormatError(f"{name}: contains NaN or Inf")
        if kind == "rotation":
            err = orthogonality_error(arr)
            if err >= ORTHO_TOL:
                raise BundleFormatError(f"{name}: not orthogonal (max |R R^T - I| = {err:.2e}, "
                                        f"limit {ORTHO_TOL:g})")
        if kind == "clip" and ((arr < 0) | (arr > 1)).any():
            raise BundleFormatError(f"{name}: clip ratios must lie in [0, 1]")


def orthogonality_error(r: np.ndarray) -> float:
    """max |R R^T - I| over one [d,d] or a stack [h,d,d], computed in float64."""
    r64 = np.asarray(r, dtype=np.float64)
    eye = np.eye(r64.shape[-1])
    return float(np.abs(r64 @ np.swapaxes(r64, -1, -2) - eye).max())


def summary(manifest: Manifest) -> dict:
    """A short, JSON-able description for `inspect` and progress output."""
    geo = manifest.geometry
    return {
        "model": manifest.model.name,
        "hub_id": manifest.model.hub_id,
        "layers": len(geo.attention_layers) or geo.num_layers,
        "kv_heads": geo.num_kv_heads,
        "head_dim": geo.head_dim,
        "method": f"K {manifest.method.k_objective} / V {manifest.method.v_objective}, "
                  f"{manifest.method.compositions()}, per {manifest.method.granularity}",
        "key_centering": manifest.method.key_centering,
        "clip": {"k": manifest.clip.k_global, "v": manifest.clip.v_global,
                 "granularity": manifest.clip.granularity, "searched": manifest.clip.searched},
        "group_size": manifest.quantization.group_size,
        "source": manifest.calibration.source,
        "tokens": manifest.calibration.tokens,
        "validated": None if manifest.validation is None else manifest.validation.passed,
        "files": {f.name: f.size for f in manifest.files},
    }


def dumps_summary(manifest: Manifest) -> str:
    return json.dumps(summary(manifest), indent=2)
