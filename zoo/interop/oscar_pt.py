"""OSCAR's SGLang rotation checkpoints (`.pt`), both directions (oscar-spec 1.1-1.7).

Read: format_version 1 (per layer), 2 (per KV head), 3 (companion fields), "identity-v1".
Write: 1 for per-layer bundles, 2 for per-head ones, 3 when the bundle centers keys (k_mean).
Layer ids are global (hybrid models skip their linear-attention layers). `.pt` files are loaded
only with torch.load(weights_only=True): a pickle that wants to run code is refused unrun.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BundleFormatError, UnsafePickleError

ORTHO_TOL = 1e-4


@dataclass
class OscarLayer:
    rotation: np.ndarray                 # [d,d] or [H,d,d]
    eigenvalues: np.ndarray | None = None
    k_mean: np.ndarray | None = None     # [d] or [H,d] (format 3)


@dataclass
class OscarFile:
    format_version: int | str
    objective: str
    source_grouping: str
    layers: dict[int, OscarLayer] = field(default_factory=dict)
    calibration: dict | None = None
    transform: dict | None = None        # format 3: {key, centered, orthogonal}

    @property
    def per_head(self) -> bool:
        # Loaders dispatch on rotation.dim(), not on format_version (oscar-spec 1.3).
        return next(iter(self.layers.values())).rotation.ndim == 3


# --- read ------------------------------------------------------------------------------------

def load_pt(path: str | Path) -> dict:
    try:
        import torch
    except ImportError:
        raise UnsafePickleError(
            f"reading {Path(path).name} needs torch: OSCAR .pt files are pickles and oscar-zoo "
            "only opens them with torch.load(weights_only=True). Install torch, or pull from an "
            "oscar-zoo registry or mirror (safetensors, no pickles).") from None

    path = Path(path)
    _check_is_checkpoint(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafePickleError(
            f"{path.name} was refused: it is not a plain tensor checkpoint and loading it would "
            f"run code ({str(e).splitlines()[0][:160]}). Only load rotation files from sources "
            "you trust; nothing in it was executed.") from None
    except FileNotFoundError:
        raise BundleFormatError(f"no such file: {path}") from None
    except Exception as e:     # a ZIP or pickle header, then something torch cannot read
        raise BundleFormatError(f"{path.name} is not a readable torch checkpoint ({_why(e)}); it "
                                f"looks cut short or damaged: {_GET_ONE}") from None
    if not isinstance(obj, dict):
        raise BundleFormatError(f"{path.name}: expected a dict checkpoint, got {type(obj).__name__}"
                                " (bare MLA latent rotations are not supported)")
    return obj


# how to get a file this reads, for every "not a checkpoint" error
_GET_ONE = ("pass the k_rotation_*.pt and v_rotation_*.pt files OSCAR's calibration wrote with "
            "torch.save, or get a model's from the RotationZoo with `oscar-zoo pull MODEL "
            "--format sglang --out DIR`")
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"   # torch.save: a ZIP archive, or (legacy) pickle protocol 2


def _check_is_checkpoint(path: Path) -> None:
    """Refuse, naming what it is instead, a file that cannot be a torch.save output: torch's
    unpickler then says only "Unsupported operand 105" (105: the byte 'i' of a text file) or
    raises a KeyError holding a byte value. A missing file is torch.load's to report."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return
    if head.startswith((_ZIP, _PICKLE)) or head[257:262] == b"ustar":   # ustar: torch < 0.4's tar
        return
    what, fix = _what_it_is(head)
    raise BundleFormatError(f"{path.name} is not a torch checkpoint (a ZIP archive, as torch.save "
                            f"writes) but {what}: {fix or _GET_ONE}")


def _what_it_is(head: bytes) -> tuple[str, str | None]:
    """What a file's first bytes say it is, and the fix where it is not the generic one."""
    if not head:
        return "an empty file", None
    if head.startswith(b"version https://git-lfs"):
        return ("a Git LFS pointer to it", "run `git lfs pull` in that checkout to fetch the "
                "file itself")
    if head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30:  # header size, JSON
        return ("a safetensors file (a bundle's rotations.safetensors?)", "`oscar-zoo convert "
                "--to sglang BUNDLE_DIR --out DIR` writes OSCAR files from a bundle")
    text = head.lstrip()
    if text[:1] in (b"{", b"["):
        return "JSON (a bundle.json?)", None
    if text[:1] == b"<":
        return "an HTML or XML page (a download that saved an error or login page?)", None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:     # not just a character cut at the 512th byte
            return f"binary data starting {head[:8].hex(' ')}", None
    return "a text file", None


def _why(e: Exception) -> str:
    """A torch error as a reason: its first sentence, or its type where the message is no
    more than a raw value (a KeyError of one byte, as '105')."""
    text = (str(e).strip().splitlines() or [""])[0].split(". ")[0].strip()
    return type(e).__name__ if not text or text.strip("'\"").isdigit() else text[:160]


def parse(obj: dict, where: str = "checkpoint") -> OscarFile:
    layers = obj.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise BundleFormatError(f"{where}: no 'layers' dict; is this an OSCAR rotation file?")
    fv = obj.get("format_version", 1)
    if fv not in (1, 2, 3, "identity-v1"):
        raise BundleFormatError(f"{where}: unknown format_version {fv!r} (known: 1, 2, 3, identity-v1)")
    out = OscarFile(fv, str(obj.get("objective", "")), str(obj.get("source_grouping", "")),
                    calibration=obj.get("calibration"), transform=obj.get("transform"))
    keys: dict[int, object] = {}
    for key, entry in layers.items():
        lid = _layer_id(key, where)
        if lid in keys:
            # Loaders accept both 3 and "3" (oscar-spec 1.1), so a file with both is ambiguous:
            # which rotation SGLang serves depends on its loader, not on what the author meant.
            raise BundleFormatError(
                f"{where}: has layer {lid} twice (keys {keys[lid]!r} and {key!r}); keep one entry "
                "per layer id and write the file again")
        keys[lid] = key
        out.layers[lid] = _parse_layer(entry, f"{where} layer {lid}")
    dims = {layer.rotation.ndim for layer in out.layers.values()}
    if len(dims) != 1:
        raise BundleFormatError(f"{where}: mixes per-layer and per-head rotations")
    return out


def _layer_id(key, where: str) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise BundleFormatError(f"{where}: layer key {key!r} is not an integer layer id") from None


def _parse_layer(entry: dict, where: str) -> OscarLayer:
    if not isinstance(entry, dict) or "rotation" not in entry:
        raise BundleFormatError(f"{where}: missing 'rotation'")
    rot = _array(entry["rotation"], where)
    if rot.ndim not in (2, 3) or rot.shape[-1] != rot.shape[-2]:
        raise BundleFormatError(f"{where}: rotation shape {rot.shape} is not [d,d] or [H,d,d]")
    _check_orthogonal(rot, where)
    for companion in ("q_rotation", "o_rotation"):
        # Format 3 non-orthogonal transforms: R^-T differs from R and our bundles cannot hold it.
        if entry.get(companion) is not None:
            other = _array(entry[companion], where)
            if other.shape != rot.shape or np.abs(other - rot).max() > ORTHO_TOL:
                raise BundleFormatError(
                    f"{where}: {companion} differs from rotation, i.e. a non-orthogonal transform. "
                    "oscar-zoo bundles hold orthogonal rotations only (OSCAR's own results show "
                    "non-orthogonal key transforms collapse at long context under INT2).")
    eig = entry.get("eigenvalues")
    mean = entry.get("k_mean")
    return OscarLayer(rot, None if eig is None else _array(eig, where),
                      None if mean is None else _array(mean, where))


def _array(t, where: str) -> np.ndarray:
    if hasattr(t, "detach"):
        a = t.detach().cpu().float().numpy()
    else:
        raise BundleFormatError(f"{where}: expected a tensor, got {type(t).__name__}")
    if not np.isfinite(a).all():
        raise BundleFormatError(f"{where}: contains NaN or Inf")
    return a


def _check_orthogonal(rot: np.ndarray, where: str) -> None:
    r = rot.astype(np.float64)
    err = np.abs(r @ np.swapaxes(r, -1, -2) - np.eye(r.shape[-1])).max()
    if err >= ORTHO_TOL:
        raise BundleFormatError(f"{where}: rotation is not orthogonal (max |R R^T - I| = {err:.2e})")


def read_file(path: str | Path) -> OscarFile:
    return parse(load_pt(path), Path(path).name)


# --- write -----------------------------------------------------------------------------------

def write_file(path: str | Path, f: OscarFile, durable: bool = True) -> None:
    """The dict schema of oscar-spec 1.1/1.3/1.4, as torch.save would write it (no torch needed)."""
    from .pt_writer import dump

    dump(oscar_dict(f), path, durable=durable)


def oscar_dict(f: OscarFile) -> dict:
    layers = {}
    for lid, layer in sorted(f.layers.items()):
        entry = {"layer_id": int(lid), "rotation": np.asarray(layer.rotation, np.float32)}
        if layer.eigenvalues is not None:
            entry["eigenvalues"] = np.asarray(layer.eigenvalues, np.float32)
        if layer.k_mean is not None:
            entry["k_mean"] = np.asarray(layer.k_mean, np.float32)
        layers[int(lid)] = entry
    obj = {"format_version": f.format_version, "objective": f.objective,
           "source_grouping": f.source_grouping, "layers": layers}
    if f.calibration is not None:
        obj["calibration"] = f.calibration
    if f.transform is not None:
        obj["transform"] = f.transform
    return obj
