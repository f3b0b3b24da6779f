"""Canonical bundle <-> OSCAR SGLang checkpoint pair.

Import needs the model's geometry (catalog entry or config.json) because OSCAR files do not
record it; every layer id and shape is checked against it, so a wrong-model file fails here
rather than silently loading the wrong matrix in an engine (oscar-spec 7.2).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import __version__
from ..bundle import Bundle, SideTensors
from ..errors import BundleFormatError, InvalidInput
from ..catalog import CatalogEntry
from ..files import atomic_writers
from ..geometry import ModelGeometry
from ..manifest import (COMPOSITIONS, Calibration, Clip, Geometry, Manifest, Method, ModelRef,
                        Quantization, utc_now)
from .oscar_pt import OscarFile, OscarLayer, oscar_dict, read_file
from .pt_writer import dumps

_TAG = re.compile(r"seq(\d+)_prompt(\d+)_group(\d+)")


@dataclass(frozen=True)
class ServingDefaults:
    """Clip ratios and INT2 settings recorded with an imported bundle (the files hold none)."""

    k_clip: float = 0.96
    v_clip: float = 0.92
    group_size: int = 128
    sink_tokens: int = 64
    recent_tokens: int = 256
    lloyd_max: bool = False

    def __post_init__(self):
        # checked here, not by the manifest's schema: that fails later, as a pydantic traceback
        for flag, ratio in (("--k-clip", self.k_clip), ("--v-clip", self.v_clip)):
            if not 0 <= ratio <= 1:     # NaN too
                raise InvalidInput(f"{flag} {ratio:g}: a clip ratio is the share of each row's "
                                   "|x| kept unclipped, in [0, 1] (0 turns clipping off); OSCAR "
                                   "ships 0.96 for K and 0.92 for V")
        if self.group_size <= 0:
            raise InvalidInput(f"--group-size {self.group_size}: pass a positive power of two "
                               "dividing head_dim, such as 128")

    @classmethod
    def of(cls, entry: CatalogEntry, **overrides) -> "ServingDefaults":
        base = dict(k_clip=entry.k_clip, v_clip=entry.v_clip, group_size=entry.group_size,
                    sink_tokens=entry.sink_tokens, recent_tokens=entry.recent_tokens,
                    lloyd_max=entry.lloyd_max)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


def architecture_from_config(entry: CatalogEntry, config: str | Path | None) -> CatalogEntry:
    """The entry with the architecture its config.json names (`architectures[0]`, as a
    calibration records it) where the catalog has none: catalog.resolve makes a model it does
    not know "unknown", and the manifest and model card would say so for good."""
    if config is None or entry.architecture != "unknown":
        return entry
    path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    # resolve() has read and parsed it already
    named = (json.loads(path.read_text()).get("architectures") or [None])[0]
    return replace(entry, architecture=named) if isinstance(named, str) and named else entry


def _method(objective: str) -> tuple[str, str]:
    """OSCAR objective string -> (our objective, composition)."""
    if objective.startswith("oscar2_"):
        objective = objective[len("oscar2_"):]
    if objective in ("hadamard",):
        return "hadamard", "none"
    if objective.startswith("identity"):
        return "identity", "none"
    if objective == "cov_eig_hadamard_perhead":  # V2: own covariance, eigvecs by desc. eigenvalue, then H
        return "own", "r_h"
    m = re.match(r"^(qqt|sst|ktk|vtv)_(.+)$", objective)
    if m and m.group(2) in COMPOSITIONS:
        return m.group(1), m.group(2)
    return "imported", "none"  # a newer OSCAR's recipe: the rotations load, the label is ours


_SIDE_OF_OBJECTIVE = {"qqt": "k", "ktk": "k", "sst": "v", "vtv": "v"}


def _side_of(objective: str) -> str | None:
    """The side ("k" or "v") an OSCAR objective string is fitted for, where it says one;
    None for those either side carries (hadamard, per-head, identity, uresidual, unknown)."""
    if objective.startswith("oscar2_v_") or objective == "identity-v":
        return "v"                      # format 3 V files: oscar2_v_<pre_wo|post_wo|...>
    if objective.startswith("oscar2_") or objective == "identity-k":
        return "k"                      # format 3 K files: oscar2_<key-variant>
    return _SIDE_OF_OBJECTIVE.get(objective.split("_", 1)[0])


def _check_sides(k: OscarFile, v: OscarFile) -> None:
    # Both files are [d,d] per layer, so shapes cannot tell K from V: a swapped pair would load
    # and serve keys rotated for values (and back), a collapsed model with no error anywhere.
    for side, f in (("k", k), ("v", v)):
        other = _side_of(f.objective)
        if other not in (None, side):
            raise BundleFormatError(
                f"the {side.upper()} file has objective {f.objective!r}, which OSCAR fits for "
                f"{other.upper()}: were the K and V files swapped? Pass the K file first.")


def bundle_from_oscar(k: OscarFile, v: OscarFile, model: CatalogEntry, serving: ServingDefaults,
                      imported_from: str, tag: str = "") -> Bundle:
    geo = model.geometry
    _check_sides(k, v)
    _check_layers("k", k, geo)
    _check_layers("v", v, geo)
    if k.per_head != v.per_head:
        raise BundleFormatError("the K file is per head and the V file is not (or vice versa)")
    k_obj, k_comp = _method(k.objective)
    v_obj, v_comp = _method(v.objective)
    k_obj = {"own": "ktk"}.get(k_obj, k_obj)
    v_obj = {"own": "vtv"}.get(v_obj, v_obj)
    if k_obj not in ("qqt", "ktk", "hadamard", "identity"):
        k_obj = "imported"
    if v_obj not in ("sst", "vtv", "hadamard", "identity"):
        v_obj = "imported"
    centered = [lid for lid, layer in k.layers.items() if layer.k_mean is not None]
    if centered and len(centered) != len(k.layers):
        raise BundleFormatError("k_mean is present on some layers but not all")
    bundle = Bundle(_manifest(model, serving, k, v, (k_obj, v_obj, k_comp, v_comp), bool(centered),
                              imported_from, tag))
    for side, f, clip in (("k", k, serving.k_clip), ("v", v, serving.v_clip)):
        for lid, layer in f.layers.items():
            h = geo.kv_heads_of(lid)
            mean = None
            if layer.k_mean is not None:
                mean = np.broadcast_to(layer.k_mean, (h, geo.head_dim_of(lid))).copy()
            bundle.side(side)[lid] = SideTensors(
                rotation=layer.rotation, clip=np.full((h,), clip, np.float32),
                eigenvalues=layer.eigenvalues, mean=mean)
    return bundle


def _check_layers(side: str, f: OscarFile, geo: ModelGeometry) -> None:
    have, want = sorted(f.layers), geo.layers()
    if have != want:
        raise BundleFormatError(
            f"{side} file has layers {_short(have)} but the model's attention layers are "
            f"{_short(want)}; is this file for another model (or keyed by local ids)?")
    for lid, layer in f.layers.items():
        d, h = geo.head_dim_of(lid), geo.kv_heads_of(lid)
        want_shape = (h, d, d) if layer.rotation.ndim == 3 else (d, d)
        if layer.rotation.shape != want_shape:
            raise BundleFormatError(f"{side} layer {lid}: rotation {layer.rotation.shape}, "
                                    f"model needs {want_shape}")
        if layer.k_mean is not None and layer.k_mean.shape not in ((d,), (h, d)):
            raise BundleFormatError(f"{side} layer {lid}: k_mean {layer.k_mean.shape}, "
                                    f"model needs {(d,)} or {(h, d)}")


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 8 else f"[{ids[0]}, {ids[1]}, ..., {ids[-1]}] ({len(ids)} layers)"


def _manifest(model: CatalogEntry, s: ServingDefaults, k: OscarFile, v: OscarFile,
              method: tuple[str, str, str, str], centered: bool, imported_from: str,
              tag: str) -> Manifest:
    k_obj, v_obj, k_comp, v_comp = method
    cal = dict(k.calibration or {})
    tagm = _TAG.search(tag or "")
    return Manifest(
        model=ModelRef(name=model.name, hub_id=model.hub_id, architecture=model.architecture,
                       revision=cal.get("model_revision")),
        geometry=Geometry.of(model.geometry),
        method=Method(k_objective=k_obj, v_objective=v_obj, composition=k_comp,
                      v_composition=None if v_comp == k_comp else v_comp,
                      granularity="kv_head" if k.per_head else "layer", key_centering=centered),
        quantization=Quantization(group_size=s.group_size, sink_tokens=s.sink_tokens,
                                  recent_tokens=s.recent_tokens, lloyd_max=s.lloyd_max),
        clip=Clip(granularity="global", searched=False, k_global=s.k_clip, v_global=s.v_clip,
                  k_min=s.k_clip, k_median=s.k_clip, k_max=s.k_clip,
                  v_min=s.v_clip, v_median=s.v_clip, v_max=s.v_clip),
        calibration=Calibration(
            source="imported", imported_from=imported_from, code_version=__version__,
            created_at=utc_now(),
            tokens=cal.get("tokens") or (int(tagm.group(1)) if tagm else None),
            prompts=int(tagm.group(2)) if tagm else None,
            dataset_sha256=cal.get("prompt_sha256")),
    )


def import_files(k_path: str | Path, v_path: str | Path, model: CatalogEntry,
                 serving: ServingDefaults, imported_from: str | None = None) -> Bundle:
    k_path, v_path = Path(k_path), Path(v_path)
    return bundle_from_oscar(read_file(k_path), read_file(v_path), model, serving,
                             imported_from or f"file:{k_path.parent}", tag=str(k_path.parent))


# --- export ----------------------------------------------------------------------------------

def oscar_names(manifest: Manifest) -> tuple[str, str]:
    """OSCAR's file names (oscar-spec 1.6), so engine scripts find them unchanged."""
    m = manifest.method
    if m.granularity == "kv_head":
        return "k_rotation_perhead.pt", "v_rotation_perhead.pt"
    return _file_name("k", m.k_objective, m.composition_of("k")), \
        _file_name("v", m.v_objective, m.composition_of("v"))


def _file_name(side: str, objective: str, composition: str) -> str:
    if objective == "hadamard" and composition == "none":
        return f"{side}_rotation_hadamard.pt"
    return f"{side}_rotation_{objective}_{composition if composition != 'none' else 'r_h_pbr'}.pt"


def oscar_files(bundle: Bundle) -> tuple[OscarFile, OscarFile]:
    m = bundle.manifest
    per_head = m.method.granularity == "kv_head"
    centered = m.method.key_centering
    fv = 3 if centered else (2 if per_head else 1)
    grouping = ("head" if per_head else "layer") if fv == 3 else ("per_kv_head" if per_head else "layer")
    k_objective = _objective(m.method.k_objective, m.method.composition_of("k"))
    k = OscarFile(fv, f"oscar2_{k_objective}" if centered else k_objective, grouping)
    if centered:
        calib = {"model_path": m.model.hub_id, "model_revision": m.model.revision,
                 "tokens": m.calibration.tokens, "global_q_heads": m.geometry.num_q_heads,
                 "global_kv_heads": m.geometry.num_kv_heads, "fitter": f"oscar-zoo {__version__}"}
        k.calibration = {key: val for key, val in calib.items() if val is not None}
        k.transform = {"key": k_objective, "centered": True, "orthogonal": True}
    v = OscarFile(2 if per_head else 1, _objective(m.method.v_objective, m.method.composition_of("v")),
                  "per_kv_head" if per_head else "layer")
    for lid in bundle.layers:
        kt, vt = bundle.k[lid], bundle.v[lid]
        # Format 2 files carry no eigenvalues (oscar-spec 1.3).
        k.layers[lid] = OscarLayer(kt.rotation, None if per_head else kt.eigenvalues,
                                   kt.mean if centered else None)
        v.layers[lid] = OscarLayer(vt.rotation, None if per_head else vt.eigenvalues)
    return k, v


def _objective(name: str, composition: str) -> str:
    # OSCAR writes a bare "hadamard" (oscar-spec 2.11): "hadamard_none" would read back as
    # an unknown, imported objective.
    return name if composition == "none" else f"{name}_{composition}"


_PER = {"layer": "layer", "kv_head": "KV head"}
OSCAR_CLIPS = (0.96, 0.92)      # K, V: what OSCAR's run scripts launch SGLang with


def clip_note(bundle: Bundle) -> str | None:
    """What the SGLang files lose of this bundle's clip ratios and the pair to launch SGLang
    with; None for OSCAR's own global pair, unsearched (0.96 / 0.92: what its runs set).

    OSCAR's files hold rotations only: SGLang reads one K and one V ratio per server from its
    environment, so per-layer or per-head ratios have nowhere to go."""
    clip = bundle.manifest.clip
    spread = {side: _clip_values(bundle, side) for side in ("k", "v")}
    uneven = any(not np.allclose(values, pair, rtol=0, atol=1e-6) for values, pair in
                 ((spread["k"], clip.k_global), (spread["v"], clip.v_global)))
    per = _PER.get(clip.granularity) or ("KV head" if uneven else None)
    oscars = (round(clip.k_global, 6), round(clip.v_global, 6)) == OSCAR_CLIPS
    if per is None and not clip.searched and oscars:
        return None
    how = f"{'searched' if clip.searched else 'set'}{f' per {per}' if per else ''}"
    ranges = ", ".join(f"{side.upper()} {_span(v)}" for side, v in spread.items())
    kept = f"per-{per.replace(' ', '-')} values" if per else ""
    lost = (f"so the {kept} are lost in this format" if per
            else "so SGLang serves whatever pair it is launched with")
    return (f"this bundle's clip ratios were {how} ({ranges}); OSCAR's SGLang files carry no clip "
            f"ratios and SGLang takes one K and one V ratio per server, {lost}. Launch SGLang "
            f"with SGLANG_OSCAR_K_CLIP_RATIO={clip.k_global:g} and "
            f"SGLANG_OSCAR_V_CLIP_RATIO={clip.v_global:g}, the bundle's global pair, as in the "
            "launch recipe `oscar-zoo export --format sglang` prints."
            + (_served_cost(bundle.manifest, kept) if per else ""))


def _clip_values(bundle: Bundle, side: str) -> np.ndarray:
    tensors = bundle.side(side).values()
    return np.concatenate([t.clip.ravel() for t in tensors]) if tensors else np.zeros(0)


def _span(values: np.ndarray) -> str:
    if not values.size:
        return "-"
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"


def _served_cost(m: Manifest, kept: str) -> str:
    """The price of the one pair, where validation measured the bundle both ways."""
    by = {r.name: r.delta_nll for r in (m.validation.variants if m.validation else [])}
    if "bundle" not in by or "bundle-served" not in by:
        return ""
    return (f" Validation measured {by['bundle-served']:+.4f} nats/token of extra loss with that "
            f"pair, {by['bundle']:+.4f} with the {kept}.")


def export_files(bundle: Bundle, out_dir: str | Path) -> tuple[Path, Path]:
    """Write the K and V checkpoints into out_dir together: a failure or Ctrl-C leaves both as
    they were, never a new K beside an old V (both [d, d]: SGLang would load the pair silently)."""
    out_dir = Path(out_dir)
    k_name, v_name = oscar_names(bundle.manifest)
    paths = [out_dir / k_name, out_dir / v_name]
    data = [dumps(oscar_dict(f), archive_name=p.stem) for p, f in zip(paths, oscar_files(bundle))]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_writers(paths) as outs:
            for out, blob in zip(outs, data):
                out.write(blob)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:
        raise InvalidInput(f"--out {out_dir}: cannot write there ({e.strerror}: {e.filename}); "
                           "move that or choose another directory") from None
    return paths[0], paths[1]
